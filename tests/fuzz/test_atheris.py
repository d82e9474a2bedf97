"""The atheris bridge: the same tests, coverage-guided through Hypothesis' fuzz_one_input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flashcheck.errors import EnvironmentUnavailable, InvalidArgument, ViolationFound
from flashcheck.fuzzing.atheris_bridge import fuzz_one_input, load_atheris
from flashcheck.fuzzing.metadata import flashcheck_builder, metadata_builder_test
from flashcheck.layout import PaddingPolicy, PagedLayout

SRC = str(Path(__file__).resolve().parents[2] / "src")


def broken_builder(spec: object, pad_to: int, padding: PaddingPolicy, allocator: str, seed: int) -> PagedLayout:
    """Forgets that padded rows must repeat the last indptr value (they point past the real pages)."""
    layout = flashcheck_builder(spec, pad_to, padding, allocator, seed)  # type: ignore[arg-type]
    if layout.padded_batch_size > layout.batch_size:
        layout.kv_indptr[layout.batch_size + 1 :] += 1
    return layout


def test_missing_atheris_is_a_friendly_environment_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "atheris", None)
    with pytest.raises(EnvironmentUnavailable, match=r"pip install 'flashcheck\[fuzz\]'"):
        load_atheris()


def test_fuzz_one_input_drives_the_given_test_and_fails_on_bad_metadata() -> None:
    good = fuzz_one_input(metadata_builder_test(flashcheck_builder))
    bad = fuzz_one_input(metadata_builder_test(broken_builder))
    raised = 0
    for i in range(64):
        data = os.urandom(64) if i else bytes(64)
        good(data)  # the builder under test is correct: never raises
        try:
            bad(data)
        except ViolationFound as exc:
            assert {f.id for f in exc.findings} == {"FC301"}
            raised += 1
    assert raised > 0


def test_fuzz_one_input_accepts_fuzz_tests_and_rejects_others() -> None:
    import flashcheck

    results: list[object] = []

    @flashcheck.fuzz(target="cpu-reference", config={"max_kv_len": 128, "max_pages": 128}, device="cpu", seed=1)
    def test_x(step: object, result: object) -> None:
        results.append(result)

    entry = fuzz_one_input(test_x)
    entry(bytes(200))  # one state-machine example through the bytes interface
    assert results and all(r.findings == [] for r in results)  # type: ignore[attr-defined]
    with pytest.raises(InvalidArgument):
        fuzz_one_input(lambda: None)


def test_atheris_run_finds_a_bug_and_saves_it_in_the_example_database(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is an optional extra: pip install 'flashcheck[fuzz]'")
    script = tmp_path / "fuzz_builder.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_atheris import broken_builder
        from flashcheck.fuzzing.atheris_bridge import run_atheris
        from flashcheck.fuzzing.metadata import metadata_builder_test

        run_atheris(metadata_builder_test(broken_builder), instrument=[broken_builder], runs=2000,
                    argv=["-seed=1"])
    """)
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False
    )
    out = proc.stdout + proc.stderr  # atheris prints the Python exception on stdout, libFuzzer on stderr
    assert proc.returncode != 0, out[-2000:]
    assert "ViolationFound" in out and "FC301" in out, out[-2000:]
    saved = list((tmp_path / ".hypothesis" / "examples").rglob("*"))
    assert any(p.is_file() for p in saved), "the failing input must land in the Hypothesis example database"


def test_atheris_run_on_a_correct_builder_completes(tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is an optional extra: pip install 'flashcheck[fuzz]'")
    script = tmp_path / "fuzz_ok.py"
    script.write_text(
        textwrap.dedent("""
        from flashcheck.fuzzing.atheris_bridge import run_atheris
        from flashcheck.fuzzing.metadata import flashcheck_builder, metadata_builder_test

        run_atheris(metadata_builder_test(flashcheck_builder), instrument=[flashcheck_builder], runs=200,
                    argv=["-seed=1"])
    """)
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Done 200 runs" in proc.stderr
