"""The summary cache of `flashcheck static` and its processes: findings are the same with one process or two, with
a cold cache or a warm one; a changed file is parsed again; a corrupt or unwritable entry never fails a run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flashcheck.cli import main
from flashcheck.verifier import StaticConfig, check_paths, load_config
from flashcheck.verifier.cache import SummaryCache, cache_key
from flashcheck.verifier.frontend import summarise_files
from flashcheck.verifier.source import discover

FIXTURES = Path(__file__).parent.parent / "rules" / "fixtures"
SRC = Path(__file__).parent.parent.parent / "src"


def findings(project: Path, **settings: Any) -> list[tuple[Any, ...]]:
    """Everything a finding says, for one run over `project` with its own configuration."""
    pyproject = project / "pyproject.toml"
    config = load_config(pyproject) if pyproject.is_file() else StaticConfig(root=str(project))
    result = check_paths([str(project)], config.with_overrides(**settings))
    assert result.internal_errors == []
    return [
        (
            f.id,
            f.location.file,
            f.location.line,
            f.location.column,
            f.location.function,
            f.message,
            f.confidence.value,
            json.dumps(f.evidence, sort_keys=True, default=str),
            tuple((s.file, s.line, s.function, s.code) for s in f.stack),
        )
        for f in result.findings
    ]


def engine(tmp_path: Path, name: str = "engine_vllm") -> Path:
    dest = tmp_path / name
    shutil.copytree(FIXTURES / name, dest)
    return dest


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "summaries").rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))


@pytest.mark.parametrize("name", ["engine_vllm", "engine_sglang", "engine_trtllm", "engine_rtpllm"])
def test_findings_do_not_depend_on_jobs_or_the_cache(tmp_path: Path, name: str) -> None:
    project = engine(tmp_path, name)
    cache = str(tmp_path / "cache")
    plain = findings(project, jobs=1)
    assert plain, f"{name} has findings to compare"
    assert findings(project, jobs=1, cache_dir=cache) == plain  # cold: parsed here, written here
    assert entries(Path(cache))
    assert findings(project, jobs=1, cache_dir=cache) == plain  # warm: every summary loaded
    assert findings(project, jobs=2, cache_dir=cache) == plain


def test_forked_writers_fill_the_cache_with_the_same_summaries(tmp_path: Path) -> None:
    """jobs=2 writes new entries in forked processes (in a child process of its own: a test worker may run threads,
    and then the main process writes them itself); a warm run from those entries finds the same."""
    project = engine(tmp_path)
    (project / "v1" / "extra").mkdir()
    for i in range(120):  # more files than one writer's batch
        (project / "v1" / "extra" / f"m{i}.py").write_text(f"def f{i}(x):\n    assert x > {i}\n    return x\n")
    cache = tmp_path / "cache"
    plain = findings(project, jobs=1)
    code = (
        "import sys, json; from flashcheck.verifier import check_paths, load_config; "
        "from pathlib import Path; p = Path(sys.argv[1]); "
        "c = load_config(p / 'pyproject.toml').with_overrides(jobs=2, cache_dir=sys.argv[2]); "
        "r = check_paths([str(p)], c); print(len(r.findings))"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(project), str(cache)], capture_output=True, text=True, env=env, check=True
    )
    assert int(out.stdout) == len(plain)
    assert len(entries(cache)) == len(list(project.rglob("*.py")))
    files = discover([str(project)], (), project)
    warm = summarise_files(files, project, jobs=1, cache=SummaryCache(cache))
    assert warm.loaded == len(files)
    assert findings(project, jobs=1, cache_dir=str(cache)) == plain


def test_a_changed_file_is_parsed_again(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "a.py").write_text("def check(n):\n    return n\n")
    (project / "b.py").write_text("def other(m):\n    return m\n")
    cache = tmp_path / "cache"
    assert findings(project, cache_dir=str(cache)) == []
    (project / "a.py").write_text("def check(n):\n    assert n > 0\n    return n\n")
    files = discover([str(project)], (), project)
    run = summarise_files(files, project, cache=SummaryCache(cache))
    assert run.loaded == 1  # b.py only
    got = findings(project, cache_dir=str(cache))
    assert [(f[0], f[1], f[2]) for f in got] == [("FC109", "a.py", 2)]
    assert got == findings(project)


def test_same_content_in_another_module_or_place_is_its_own_entry(tmp_path: Path) -> None:
    """The key holds the module name (qualified names and relative imports depend on it); an entry made at one path
    is reported at the path the file has now."""
    source = "def check(n):\n    assert n > 0\n"
    assert cache_key(source.encode(), "pkg.a", False) != cache_key(source.encode(), "pkg.b", False)
    assert cache_key(source.encode(), "pkg", True) != cache_key(source.encode(), "pkg", False)
    cache = str(tmp_path / "cache")
    first, second = tmp_path / "one", tmp_path / "two"
    for root in (first, second):
        root.mkdir()
        (root / "a.py").write_text(source)
    assert findings(first, cache_dir=cache)[0][1] == "a.py"
    moved = findings(second, cache_dir=cache)  # same module name and content: loaded, placed at second/a.py
    assert moved == findings(second)
    files = discover([str(second)], (), second)
    run = summarise_files(files, second, cache=SummaryCache(cache))
    assert run.loaded == 1 and run.summaries[0][0].path == files[0]


@pytest.mark.parametrize("damage", [b"", b"flashcheck-summary\n", b"flashcheck-summary\n\x80\x05garbage", b"junk"])
def test_a_corrupt_entry_is_ignored_and_written_again(tmp_path: Path, damage: bytes) -> None:
    project = engine(tmp_path)
    cache = tmp_path / "cache"
    plain = findings(project, cache_dir=str(cache))
    written = entries(cache)
    for p in written:
        p.write_bytes(damage)
    assert findings(project, cache_dir=str(cache)) == plain
    assert all(p.read_bytes().startswith(b"flashcheck-summary\n\x80") and len(p.read_bytes()) > 100 for p in written)
    files = discover([str(project)], (), project)
    assert summarise_files(files, project, cache=SummaryCache(cache)).loaded == len(files)


def test_what_is_not_a_regular_file_is_never_replaced(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "a.py").write_text("def check(n):\n    assert n > 0\n")
    cache = tmp_path / "cache"
    key = cache_key((project / "a.py").read_bytes(), "a", False)
    where = SummaryCache(cache).path(key)
    where.mkdir(parents=True)  # a directory where the entry goes
    (where / "keep").write_text("mine")
    assert len(findings(project, cache_dir=str(cache))) == 1
    assert (where / "keep").read_text() == "mine"
    target = tmp_path / "elsewhere"
    target.write_text("do not touch")
    shutil.rmtree(where)
    where.symlink_to(target)  # a link where the entry goes
    assert len(findings(project, cache_dir=str(cache))) == 1
    assert where.is_symlink() and target.read_text() == "do not touch"
    a_file = tmp_path / "cache-file"
    a_file.write_text("not a directory")  # the cache directory itself is a file: no cache
    assert len(findings(project, cache_dir=str(a_file))) == 1
    assert a_file.read_text() == "not a directory"


def test_only_regular_files_are_read_as_entries_and_no_link_is_written_through(tmp_path: Path) -> None:
    """A FIFO where an entry goes would block a plain read forever, and a link would be read through: both are
    misses. A link where the cache's own directory goes turns the cache off rather than writing through it."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "a.py").write_text("def check(n):\n    assert n > 0\n")
    cache = tmp_path / "cache"
    key = cache_key((project / "a.py").read_bytes(), "a", False)
    where = SummaryCache(cache).path(key)
    where.parent.mkdir(parents=True)
    os.mkfifo(where)
    assert SummaryCache(cache).get(key) is None  # returns at once: the FIFO is not opened for a blocking read
    assert len(findings(project, cache_dir=str(cache))) == 1
    where.unlink()
    decoy = tmp_path / "decoy"
    decoy.write_bytes(b"anything")
    where.symlink_to(decoy)
    assert SummaryCache(cache).get(key) is None
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked-cache"
    linked.symlink_to(elsewhere, target_is_directory=True)
    assert len(findings(project, cache_dir=str(linked))) == 1
    assert list(elsewhere.iterdir()) == []  # nothing written through the link


def test_an_unwritable_cache_is_only_slower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = engine(tmp_path)
    plain = findings(project)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError("read-only")

    monkeypatch.setattr("flashcheck.verifier.cache.tempfile.mkstemp", refuse)
    assert findings(project, cache_dir=str(tmp_path / "cache")) == plain
    assert entries(tmp_path / "cache") == []


def test_cli_cache_options(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.flashcheck.static]\n")
    (project / "a.py").write_text("def check(n):\n    assert n > 0\n")
    monkeypatch.delenv("FLASHCHECK_STATIC_CACHE_DIR", raising=False)
    assert main(["static", str(project), "--no-cache"]) == 1
    assert not (project / ".flashcheck_cache").exists()
    assert main(["static", str(project), "--jobs", "1"]) == 1  # default: next to the pyproject.toml
    assert entries(project / ".flashcheck_cache")
    assert (project / ".flashcheck_cache" / "CACHEDIR.TAG").is_file()
    assert (project / ".flashcheck_cache" / ".gitignore").read_text().endswith("*\n")
    assert main(["static", str(project), "--cache-dir", str(tmp_path / "c"), "-j", "2"]) == 1
    assert entries(tmp_path / "c")
    monkeypatch.setenv("FLASHCHECK_STATIC_CACHE_DIR", str(tmp_path / "env"))
    assert main(["static", str(project)]) == 1
    assert entries(tmp_path / "env")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["static", str(project), "--jobs", "many"])
    assert exc.value.code == 2 and "--jobs takes a whole number" in capsys.readouterr().err


def test_the_key_follows_the_code_that_builds_summaries(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.verifier import cache

    before = cache_key(b"x = 1\n", "m", False)
    monkeypatch.setattr(cache, "SCHEMA", cache.SCHEMA + 1)
    cache._code.cache_clear()
    try:
        assert cache_key(b"x = 1\n", "m", False) != before
    finally:
        monkeypatch.undo()
        cache._code.cache_clear()
    assert cache_key(b"x = 1\n", "m", False) == before
    assert "flashcheck.verifier.index" in cache.SUMMARY_MODULES


def test_every_module_the_indexer_imports_is_part_of_the_key() -> None:
    """An edit to any module whose code builds a summary (the indexer and what it imports) changes the key."""
    import ast
    import importlib.util

    from flashcheck.verifier import cache

    seen: set[str] = set()
    todo = ["flashcheck.verifier.indexer"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None
        tree = ast.parse(Path(spec.origin).read_text())
        todo += [
            n.module
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("flashcheck.verifier")
        ]
    assert seen <= set(cache.SUMMARY_MODULES), sorted(seen - set(cache.SUMMARY_MODULES))


def test_a_link_where_a_directory_of_entries_goes_is_not_written_through(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "a.py").write_text("def check(n):\n    assert n > 0\n")
    cache = tmp_path / "cache"
    key = cache_key((project / "a.py").read_bytes(), "a", False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    SummaryCache(cache).path(key).parent.parent.mkdir(parents=True)
    SummaryCache(cache).path(key).parent.symlink_to(elsewhere)
    assert len(findings(project, cache_dir=str(cache))) == 1
    assert list(elsewhere.iterdir()) == []
