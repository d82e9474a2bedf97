"""pytest plugin (entry point ``pytest11``): markers, the ``flashcheck`` option group, fixtures, seed and versions in
the header, findings as a report section, GPU tests skipped with a reason when CUDA is absent. Under pytest-xdist the
workers run with the seed the header shows and their findings are listed at the end of the run.

Import-light: nothing here imports torch, numpy or Hypothesis at import time; fixtures and hooks import what they need
only when a flashcheck test actually runs.
"""

from __future__ import annotations

import importlib.metadata
import random
import sys
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from flashcheck import __version__
from flashcheck.errors import EnvironmentUnavailable, UsageError
from flashcheck.fuzzing.options import (
    PROFILE_NAMES,
    PROFILES,
    FuzzOptions,
    active_options,
    cuda_unavailable_reason,
    parse_budget,
    set_active_options,
    set_current_test,
)
from flashcheck.pressure import parse_pressure_us

if TYPE_CHECKING:
    from flashcheck.driver import Driver
    from flashcheck.runtime.api import CheckerLike
    from flashcheck.targets.protocol import Target

__all__ = ["cuda_unavailable_reason"]

_SEED_KEY = "flashcheck/seed"
_PREVIOUS = pytest.StashKey[FuzzOptions]()
_PREVIOUS_PROFILE = pytest.StashKey[str]()
_PREVIOUS_LOG = pytest.StashKey[dict[str, Any]]()
_WORKER_FINDINGS = pytest.StashKey[list[list[str]]]()
_WORKER_LAYERS = pytest.StashKey[list[dict[str, str]]]()
_WORKER_CHECKS = pytest.StashKey[list[dict[str, Any]]]()
_XDIST_SEED, _XDIST_FINDINGS, _XDIST_LAYERS = "flashcheck_seed", "flashcheck_findings", "flashcheck_layers"
_XDIST_CHECKS = "flashcheck_checks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flashcheck", "flashcheck fuzzing of FlashInfer / CUDA-graph serving code")
    group.addoption(
        "--flashcheck-target",
        metavar="NAME",
        default=None,
        help="target of the built-in suite and of @fuzz tests that name none: a built-in name "
        "(cpu-reference, decode-tc, ...) or module:Class",
    )
    group.addoption(
        "--flashcheck-budget",
        metavar="N|TIME",
        default=None,
        help="per fuzz test: a number of examples (200) or a time (30s, 5m); overrides the tests' own",
    )
    group.addoption(
        "--flashcheck-seed",
        metavar="INT|last",
        default=None,
        help="seed of the run (printed in the header); 'last' reuses the previous run's seed",
    )
    group.addoption(
        "--flashcheck-profile",
        metavar="NAME",
        default="auto",
        choices=PROFILE_NAMES,
        help="ci (fast), gpu (no deadline: kernels JIT-compile on first use), nightly; "
        "auto (default): gpu with CUDA, else ci",
    )
    group.addoption(
        "--flashcheck-out",
        metavar="DIR",
        default=None,
        help="directory for reproducers (default: the pytest cache, .pytest_cache/d/flashcheck-repros)",
    )
    group.addoption(
        "--async-pressure-us",
        metavar="US",
        default=None,
        help="keep the GPU stream busy for US microseconds before each host-side preparation step (plan, "
        "prepare_replay), so host work overlaps the device as in an overlapped scheduler (default: off)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "fuzz: property-based fuzz tests (built-in suites and @flashcheck.fuzz tests)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device (and usually FlashInfer); skipped otherwise")
    try:
        raw_budget = config.getoption("flashcheck_budget", None)
        budget = parse_budget(raw_budget) if raw_budget is not None else None
    except UsageError as exc:
        raise pytest.UsageError(f"--flashcheck-budget: {exc}") from None
    try:
        pressure = parse_pressure_us(config.getoption("async_pressure_us", None))
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None
    profile = str(config.getoption("flashcheck_profile", "auto") or "auto")
    out = config.getoption("flashcheck_out", None)
    out_dir = Path(out) if out else None
    cache = getattr(config, "cache", None)
    if out_dir is None and cache is not None:
        out_dir = Path(cache.mkdir("flashcheck-repros"))
    opts = FuzzOptions(
        target=config.getoption("flashcheck_target", None),
        budget=budget,
        seed=_resolve_seed(config, config.getoption("flashcheck_seed", None)),
        profile=profile,
        out_dir=out_dir,
        async_pressure_us=pressure,
    )
    config.stash[_PREVIOUS] = set_active_options(opts)
    rec = sys.modules.get("flashcheck.fuzzing.recorder")
    if rec is not None:  # a run inside a run (pytester): report only this run's findings, restore at the end
        config.stash[_PREVIOUS_LOG] = dict(rec.default_log().entries)
        rec.default_log().entries.clear()
    if profile != "auto":
        config.stash[_PREVIOUS_PROFILE] = _load_hypothesis_profile(profile)


def _resolve_seed(config: pytest.Config, raw: str | None) -> int:
    forwarded = getattr(config, "workerinput", {}).get(_XDIST_SEED)
    if forwarded is not None:  # a pytest-xdist worker: the controller resolved the seed and saved it
        return int(forwarded)
    cache = getattr(config, "cache", None)
    if raw == "last":
        last = cache.get(_SEED_KEY, None) if cache is not None else None
        if not isinstance(last, int):
            raise pytest.UsageError("--flashcheck-seed last: no previous seed in the pytest cache; pass an integer")
        seed = last
    elif raw is not None:
        try:
            seed = int(raw, 0)
        except ValueError:
            raise pytest.UsageError(f"--flashcheck-seed must be an integer or 'last', got {raw!r}") from None
    else:
        seed = random.randrange(1 << 32)
    if cache is not None:
        cache.set(_SEED_KEY, seed)
    return seed


def _load_hypothesis_profile(profile: str) -> str:
    """``--flashcheck-profile`` also applies to plain @given tests (e.g. no deadline on a GPU node); returns the
    profile it replaced, restored at the end of the run."""
    from hypothesis import HealthCheck, settings

    previous = settings.get_current_profile_name()
    spec = PROFILES[profile]
    name = f"flashcheck-{profile}"
    settings.register_profile(
        name,
        max_examples=spec.examples,
        deadline=spec.deadline_ms,
        stateful_step_count=spec.step_count,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    settings.load_profile(name)
    return previous


def pytest_unconfigure(config: pytest.Config) -> None:
    stateful = sys.modules.get("flashcheck.fuzzing.stateful")
    if stateful is not None:
        stateful.close_sessions()
    previous = config.stash.get(_PREVIOUS, None)
    if previous is not None:
        set_active_options(previous)
    saved = config.stash.get(_PREVIOUS_LOG, None)
    rec = sys.modules.get("flashcheck.fuzzing.recorder")
    if saved is not None and rec is not None:
        rec.default_log().entries.clear()
        rec.default_log().entries.update(saved)
    profile = config.stash.get(_PREVIOUS_PROFILE, None)
    if profile is not None:
        from hypothesis import settings

        settings.load_profile(profile)


def pytest_report_header(config: pytest.Config) -> list[str]:
    o = active_options()
    return [
        f"flashcheck {__version__}: seed={o.seed} (--flashcheck-seed {o.seed} or 'last' to repeat), "
        f"profile={o.profile}, target={o.target or 'per test'}, budget={o.budget or 'per profile'}"
        + (f", async pressure {o.async_pressure_us:g} us" if o.async_pressure_us else ""),
        f"flashcheck versions: torch {_dist_version('torch')}, "
        f"flashinfer {_dist_version('flashinfer-python', 'flashinfer')}, device {_device()}",
    ]


def _dist_version(*names: str) -> str:
    """The installed version from package metadata (importing FlashInfer would start its JIT machinery)."""
    for n in names:
        try:
            return importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def _device() -> str:
    """The GPU model without importing torch (the driver's /proc entry), or torch's answer if already imported."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else "cpu (no CUDA)"
        except Exception as exc:  # a broken driver must not break the header
            return f"unknown ({type(exc).__name__})"
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))
    for info in gpus:
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return f"{line.split(':', 1)[1].strip()} (x{len(gpus)})"
        except OSError:
            continue
    return "cpu (no NVIDIA driver)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    option_target = active_options().target
    for it in items:
        spec = getattr(getattr(it, "obj", None), "__flashcheck_fuzz__", None)
        if spec is None:
            continue
        it.add_marker(pytest.mark.fuzz)
        if spec.needs_gpu or (spec.target is None and _is_gpu_target(option_target)):
            it.add_marker(pytest.mark.gpu)
    gpu_items = [it for it in items if it.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    for it in gpu_items:
        it.add_marker(pytest.mark.skip(reason=reason))


def _is_gpu_target(name: str | None) -> bool:
    if name is None:
        return False
    from flashcheck.targets.registry import GPU_TARGETS

    return name in GPU_TARGETS


def pytest_runtest_setup(item: pytest.Item) -> None:
    set_current_test(item.nodeid)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    set_current_test(None)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """`EnvironmentUnavailable` (no CUDA, no FlashInfer, unsupported arch) is a skip with its reason, not a failure."""
    try:
        return (yield)
    except EnvironmentUnavailable as exc:
        pytest.skip(f"flashcheck: {exc.reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report: Any = yield
    stateful = sys.modules.get("flashcheck.fuzzing.stateful")
    if stateful is not None and call.excinfo is not None and isinstance(call.excinfo.value, stateful.FuzzFailure):
        from flashcheck.fuzzing.recorder import describe

        report.sections.append(("flashcheck findings", describe(call.excinfo.value.records)))
    return report


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, controller side: each worker runs with the seed of the header."""
    node.workerinput[_XDIST_SEED] = active_options().seed


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """pytest-xdist, worker side: hand this worker's findings to the controller (before xdist sends its output)."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[_XDIST_FINDINGS] = _finding_lines()
        output[_XDIST_LAYERS] = _layer_facts()
        output[_XDIST_CHECKS] = _checks_record()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, controller side: keep a finished worker's findings for the summary."""
    lines = getattr(node, "workeroutput", {}).get(_XDIST_FINDINGS, [])
    node.config.stash.setdefault(_WORKER_FINDINGS, []).extend(lines)
    facts = getattr(node, "workeroutput", {}).get(_XDIST_LAYERS, {})
    if facts:
        node.config.stash.setdefault(_WORKER_LAYERS, []).append(facts)
    checks = getattr(node, "workeroutput", {}).get(_XDIST_CHECKS, {})
    if checks:
        node.config.stash.setdefault(_WORKER_CHECKS, []).append(checks)


def _layer_facts() -> dict[str, str]:
    """The detection layers this process's fuzz sessions ran and skipped (empty when none ran)."""
    stateful = sys.modules.get("flashcheck.fuzzing.stateful")
    return stateful.session_layer_facts() if stateful is not None else {}


def _layer_lines(config: pytest.Config) -> list[str]:
    """One line per distinct layer fact of this process and the xdist workers: which layers watched the fuzz tests,
    and which could not run here with why (a clean run says what it was clean under)."""
    from flashcheck.rundir import merge_facts

    merged = merge_facts(_layer_facts(), *config.stash.get(_WORKER_LAYERS, []))
    return [f"{key}: {value}" for key, value in merged.items()]


def _checks_record() -> dict[str, Any]:
    """Per target name, what this process's fuzz sessions selected and exercised of the checks (JSON, for xdist)."""
    stateful = sys.modules.get("flashcheck.fuzzing.stateful")
    if stateful is None:
        return {}
    exercised = stateful.session_exercised()
    return {
        name: {"selected": sorted(ids), "record": exercised[name].to_dict() if name in exercised else {}}
        for name, ids in stateful.session_selected().items()
    }


def _check_lines(config: pytest.Config) -> tuple[list[str], bool]:
    """Per target, the checks the fuzz tests exercised, those that cannot apply here (with why) and those selected
    but never exercised, merged over this process and the xdist workers; and whether any was not exercised (no
    finding then means "clean" only for the checks that ran)."""
    from flashcheck.exercised import Exercised, merge_by_target

    selected: dict[str, set[str]] = {}
    records: list[dict[str, Exercised]] = []
    for rec in (_checks_record(), *config.stash.get(_WORKER_CHECKS, [])):
        for name, entry in rec.items():
            selected.setdefault(name, set()).update(entry["selected"])
            records.append({name: Exercised.from_dict(entry["record"])})
    merged = merge_by_target(*records)
    lines: list[str] = []
    missing_any = False
    for name in sorted(selected):
        got = merged.get(name, Exercised())
        ran = sorted(selected[name] & got.exercised)
        na = {c: why for c, why in sorted(got.not_applicable.items()) if c in selected[name] and c not in got.exercised}
        missing = sorted(selected[name] - got.exercised - set(na))
        missing_any = missing_any or bool(missing)
        lines.append(f"{name}: exercised {', '.join(ran) or 'none'}")
        lines += [f"{name}: not applicable here: {c} ({why})" for c, why in na.items()]
        if missing:
            lines.append(
                f"{name}: selected but NOT EXERCISED: {', '.join(missing)} (no step reached them: a larger budget or "
                "other shapes; no finding says nothing of these)"
            )
    return lines, missing_any


def _finding_lines() -> list[list[str]]:
    """This process's findings, each as the summary's lines."""
    rec = sys.modules.get("flashcheck.fuzzing.recorder")
    out: list[list[str]] = []
    for r in rec.default_log().entries.values() if rec is not None else []:
        where = f"[{r.test}] " if r.test else ""
        lines = [f"{where}{r.finding.id} {r.finding.name}: {r.finding.message}"]
        if r.path is not None:
            lines.append(f"    replay: flashcheck replay {r.path}")
        out.append(lines)
    return out


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    tr = terminalreporter
    layers = _layer_lines(config)
    if layers:
        tr.section("flashcheck detection layers", sep="-", yellow=any(ln.startswith("layers skipped") for ln in layers))
        for line in layers:
            tr.write_line(line)
    checks, missing = _check_lines(config)
    if checks:
        tr.section("flashcheck checks", sep="-", yellow=missing)
        for line in checks:
            tr.write_line(line)
    entries = _finding_lines() + config.stash.get(_WORKER_FINDINGS, [])
    if not entries:
        return
    tr.section("flashcheck findings", sep="=", red=True, bold=True)
    for lines in entries:
        for line in lines:
            tr.write_line(line)
    tr.write_line(f"seed {active_options().seed}: rerun with --flashcheck-seed last")


# ---- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture
def flashcheck_options() -> FuzzOptions:
    """The run's flashcheck options (target, budget, seed, profile, reproducer directory)."""
    return active_options()


@pytest.fixture
def flashcheck_target() -> Target:
    """The ``--flashcheck-target`` (default: the CPU reference target), built but not set up."""
    from flashcheck.targets.registry import make_target

    return make_target(active_options().target or "cpu-reference")


@pytest.fixture
def flashcheck_checker() -> Iterator[CheckerLike]:
    """The runtime checker with the ``all`` layers (every kind of per-step event), on CUDA when available (else
    CPU)."""
    from flashcheck.session import default_device, make_checker

    with make_checker("all", default_device()) as chk:
        yield chk


@pytest.fixture
def flashcheck_session(flashcheck_target: Target) -> Iterator[Driver]:
    """A ready `Driver` on `flashcheck_target` (skips with the reason when the environment cannot run it)."""
    from flashcheck.session import open_session

    try:
        opts = active_options()
        with open_session(flashcheck_target, seed=opts.seed or 0, async_pressure_us=opts.async_pressure_us) as drv:
            yield drv
    except EnvironmentUnavailable as exc:
        pytest.skip(f"flashcheck: {exc.reason}")
