"""The pytest plugin, tested with pytester on CPU: markers, options, seed 'last', skips, fixtures, report section."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

QUALITY = str(Path(__file__).resolve().parents[1] / "quality")

FAULTY = f"""
import sys
sys.path.insert(0, {QUALITY!r})
import torch
torch.set_num_threads(1)
import flashcheck

SMALL = {{"max_kv_len": 256, "chunk": 32, "max_pages": 256}}


# the planted bug needs no detection layer to be found (and shrinking it with them costs seconds; seed 0 finds and
# shrinks it in about a third of the time seed 5 takes); the clean test runs every layer, which the summaries name
@flashcheck.fuzz(target="faulty_targets:PlanInfoVaries", config=SMALL, budget=40, seed=0, device="cpu", layers="off")
def test_faulty_backend():
    pass


@flashcheck.fuzz(target="cpu-reference", config=SMALL, budget=3, seed=5, device="cpu")
def test_clean_backend():
    pass
"""


def test_markers_are_registered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.fuzz:*", "@pytest.mark.gpu:*"])


def test_header_has_seed_versions_and_seed_last_repeats_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    first = pytester.runpytest("--flashcheck-seed", "12345")
    first.stdout.fnmatch_lines(
        ["flashcheck 0.*seed=12345*profile=auto*", "flashcheck versions: torch *, flashinfer *, device *"]
    )
    again = pytester.runpytest("--flashcheck-seed", "last")
    again.stdout.fnmatch_lines(["flashcheck 0.*seed=12345*"])
    assert "detection layers" not in again.stdout.str()  # no fuzz session ran: nothing to say of layers
    assert again.ret == 0


def test_seed_last_without_a_previous_run_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("--flashcheck-seed", "last", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no previous seed*"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--flashcheck-seed", "abc", "*integer or 'last'*"),
        ("--flashcheck-budget", "ten", "*--flashcheck-budget*"),
        ("--async-pressure-us", "soon", "*--async-pressure-us 'soon': give a number of microseconds*"),
        ("--async-pressure-us", "-1", "*--async-pressure-us '-1': must be between 0 and*"),
    ],
)
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, option: str, value: str, message: str) -> None:
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest(option, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_options_reach_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        from flashcheck.fuzzing.options import Budget

        def test_opts(flashcheck_options, flashcheck_target):
            assert flashcheck_options.budget == Budget(seconds=90.0)
            assert flashcheck_options.seed == 7 and flashcheck_options.profile == "ci"
            assert flashcheck_options.target == "cpu-reference" and flashcheck_target.name == "cpu-reference"
            assert flashcheck_options.out_dir is not None
    """)
    result = pytester.runpytest(
        "--flashcheck-budget",
        "1.5m",
        "--flashcheck-seed",
        "7",
        "--flashcheck-profile",
        "ci",
        "--flashcheck-target",
        "cpu-reference",
    )
    result.assert_outcomes(passed=1)


def test_session_and_checker_fixtures_run_a_step(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        from flashcheck.scenario import Step

        def test_step(flashcheck_session, flashcheck_checker):
            r = flashcheck_session.execute(Step("replay", (1, 1), (5, 17)), 0)
            assert r.findings == [] and r.sample.padded == 2
            assert flashcheck_checker.drain_findings() == []
    """)
    pytester.runpytest().assert_outcomes(passed=1)


def test_gpu_tests_skip_with_a_reason_without_cuda(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest
        import flashcheck

        @pytest.mark.gpu
        def test_needs_gpu():
            raise AssertionError("must not run")

        @flashcheck.fuzz(target="decode-tc", budget=2)
        def test_builtin_gpu_target():
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*no CUDA device*"])


def test_environment_unavailable_is_a_skip(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        from flashcheck.errors import EnvironmentUnavailable

        def test_env():
            raise EnvironmentUnavailable("FlashInfer 0.6 has no sm_75 kernels")
    """)
    result = pytester.runpytest("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*flashcheck: FlashInfer 0.6 has no sm_75 kernels*"])


def test_fuzz_tests_are_marked_and_findings_are_a_report_section(pytester: pytest.Pytester) -> None:
    from hypothesis import settings

    before = settings.get_current_profile_name()
    pytester.makepyfile(test_backend=FAULTY)
    out = pytester.path / "repros"
    result = pytester.runpytest("-m", "fuzz", "--flashcheck-out", str(out), "--flashcheck-profile", "ci")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- flashcheck findings -*",  # the failing test's own section
            "*FC304 plan-info-stable*",
            "*replay:     flashcheck replay*",
            "*- flashcheck detection layers -*",  # what watched the fuzz tests, and what could not run here
            "detection layers: *graph_replay, dispatch*",
            "layers skipped: *cupti: no CUDA device*",
            "*- flashcheck checks -*",  # what the fuzz tests exercised, per target
            "cpu-reference: exercised *FC250*FC301*FC303*",
            "cpu-reference: not applicable here: FC202 (no active detection layer sees it here*",
            "*= flashcheck findings =*",  # the terminal summary
            "[[]test_backend.py::test_faulty_backend[]] FC304 plan-info-stable*",
            "seed *: rerun with --flashcheck-seed last",
        ]
    )
    assert list(out.glob("*.json"))
    assert settings.get_current_profile_name() == before  # --flashcheck-profile is undone at the end of the run


def test_checks_no_step_reached_are_named_never_passed_over(pytester: pytest.Pytester) -> None:
    """A fuzz test whose target declines every batch finds nothing; the summary says which selected checks never
    ran instead of letting a green test stand for them."""
    pytester.makepyfile(
        test_backend=FAULTY.replace("faulty_targets:PlanInfoVaries", "faulty_verdicts:RejectsEveryInput")
    )
    result = pytester.runpytest("-m", "fuzz", "-k", "faulty", "--flashcheck-profile", "ci")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*- flashcheck checks -*", "rejects-every-input: selected but NOT EXERCISED: *FC303*"])
    assert "cpu-reference: selected but NOT EXERCISED" not in result.stdout.str()


def test_fuzz_marker_deselects_plain_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_backend=FAULTY.replace("budget=40", "budget=1").replace("PlanInfoVaries", "StaleLastPageLen")
    )
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = pytester.runpytest("-m", "not fuzz")
    result.assert_outcomes(passed=1, deselected=2)


def test_builtin_suite_runs_the_cpu_reference_without_gpu(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "-m",
        "fuzz",
        "--pyargs",
        "flashcheck.fuzzing.suite",
        "--flashcheck-budget",
        "3",
        "--flashcheck-profile",
        "ci",
        "-rs",
    )
    result.assert_outcomes(passed=2, skipped=9)


VERDICTS = f"""
import sys
sys.path.insert(0, {QUALITY!r})
import torch
torch.set_num_threads(1)
import flashcheck

SMALL = {{"max_kv_len": 256, "chunk": 32, "max_pages": 256}}


@flashcheck.fuzz(target="faulty_verdicts:RaisesOnValidInput", config=SMALL, budget=15, seed=5, device="cpu")
def test_raises_on_valid_input():
    pass


@flashcheck.fuzz(target="faulty_verdicts:SpinsInPrepareReplay", config=SMALL, budget=15, seed=5, device="cpu")
def test_spins():
    pass


@flashcheck.fuzz(target="faulty_verdicts:FaultSurfacesLater", config=SMALL, budget=15, seed=5, device="cpu")
def test_fault_surfaces_later():
    pass


@flashcheck.fuzz(target="cpu-reference", config=SMALL, budget=5, seed=5, device="cpu")
def test_clean():
    pass
"""


@pytest.mark.slow
def test_plugin_reports_errors_on_valid_input_hangs_and_late_faults_as_failures(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHCHECK_STEP_TIMEOUT", "1")
    pytester.makepyfile(VERDICTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "--flashcheck-profile", "ci", "-q")
    result.assert_outcomes(failed=3, passed=1)
    out = result.stdout.str()
    assert "FC250 target-raised" in out and "raised on valid input" in out
    assert "FC252 step-hung" in out and "surfaced in flashcheck's own reads" in out
    assert "rejected" not in out.lower().replace("not rejected", "")


SEED_PER_WORKER = """
import os
from pathlib import Path


def _write(seed):
    Path(f"seed-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-{os.getpid()}").write_text(str(seed))


def test_seed_one(flashcheck_options):
    _write(flashcheck_options.seed)


def test_seed_two(flashcheck_options):
    _write(flashcheck_options.seed)
"""


@pytest.mark.slow
def test_xdist_workers_share_the_header_seed_and_report_their_findings(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist", reason="pytest-xdist is in the dev extra: pip install 'flashcheck[dev]'")
    pytester.makepyfile(test_backend=FAULTY, test_seed=SEED_PER_WORKER)
    result = pytester.runpytest("-p", "xdist", "-n", "2", "-p", "no:cacheprovider", "--flashcheck-profile", "ci")
    result.assert_outcomes(passed=3, failed=1)
    header = next(line for line in result.outlines if line.startswith("flashcheck 0") and "seed=" in line)
    seed = header.split("seed=", 1)[1].split()[0]
    seen = {p.read_text() for p in pytester.path.glob("seed-gw*")}
    assert seen == {seed}, (seed, seen)  # every worker, whichever tests it ran, used the seed the header shows
    result.stdout.fnmatch_lines(
        [
            "*- flashcheck detection layers -*",  # the workers' layers reach the controller's summary
            "detection layers: *graph_replay, dispatch*",
            "*= flashcheck findings =*",  # the controller's summary lists what a worker found
            "[[]test_backend.py::test_faulty_backend[]] FC304 plan-info-stable*",
            f"seed {seed}: rerun with --flashcheck-seed last",
        ]
    )
