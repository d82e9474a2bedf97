"""Verdicts that must never read as skipped or clean: errors on valid input, faults that surface late, hangs (in
process and in an isolated worker), output-contract violations and eager-path syncs, each with its quiet control."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flashcheck.errors import ContextPoisoned, EnvironmentUnavailable, ViolationFound
from flashcheck.findings import Location
from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.isolation import IsolatedDriver
from flashcheck.properties.output_contract import check_output_contract
from flashcheck.scenario import Step
from flashcheck.session import open_session
from flashcheck.targets.classify import classify_exception
from flashcheck.targets.reference import ReferenceTarget

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quality"))
import faulty_verdicts as fv

QUALITY = str(Path(__file__).resolve().parents[1] / "quality")


def _first(target: ReferenceTarget, n: int = 40, seed: int = 5, **kw: object) -> tuple[int, list[str]]:
    with open_session(target, device="cpu", seed=1, **kw) as drv:  # type: ignore[arg-type]
        for i, s in enumerate(random_steps(target.capacity, n, seed=seed)):
            ids = [f.id for f in drv.execute(s, i).findings]
            if ids:
                return i, ids
    return -1, []


def test_backend_error_on_valid_input_is_a_finding_not_a_rejection() -> None:
    t = fv.RaisesOnValidInput(**fv.SMALL)
    with open_session(t, device="cpu", layers="off") as drv:
        results = [drv.execute(s, i) for i, s in enumerate(random_steps(t.capacity, 40, seed=5))]
    assert all(r.rejected is None for r in results)
    hits = [f for r in results for f in r.findings]
    assert hits and {f.id for f in hits} == {"FC250"}
    assert "raised on valid input" in hits[0].hint and hits[0].location.region == "prepare_replay"


def test_a_fault_surfacing_in_flashcheck_reads_is_attributed_and_poisons() -> None:
    t = fv.FaultSurfacesLater(**fv.SMALL)
    with open_session(t, device="cpu", layers="off") as drv:
        steps = random_steps(t.capacity, 40, seed=5)
        for i, s in enumerate(steps):
            r = drv.execute(s, i)
            if r.findings:
                break
        (f,) = r.findings
        assert f.id == "FC250" and f.location.region == "replay" and f.evidence["surfaced"] == "flashcheck read"
        assert "illegal memory access" in f.message and drv.poisoned
        with pytest.raises(ContextPoisoned):
            drv.execute(steps[i + 1], i + 1)


def test_output_contract_violation_is_a_finding() -> None:
    i, ids = _first(fv.ExtraPaddedRow(**fv.SMALL), layers="off")
    assert i >= 0 and ids == ["FC305"]


def test_eager_path_sync_is_fc201_in_plan() -> None:
    t = fv.EagerHostSync(**fv.SMALL)
    with open_session(t, device="cpu", layers="all") as drv:
        found = [f for s in random_steps(t.capacity, 30, seed=5) if s.op == "eager" for f in drv.execute(s, 0).findings]
    assert found and {f.id for f in found} == {"FC201"}
    assert found[0].location.region == "plan" and "faulty_verdicts.py" in (found[0].location.file or "")


def test_clean_reference_stays_quiet_with_every_layer_and_the_watchdog() -> None:
    assert _first(ReferenceTarget(**fv.SMALL), layers="all", step_timeout=30.0) == (-1, [])


def test_a_session_names_the_layers_it_runs_and_those_it_skipped_with_why() -> None:
    t = ReferenceTarget(**fv.SMALL)
    with open_session(t, device="cpu", layers="cheap") as drv:
        facts = drv.layer_facts()
    assert facts["detection layers"] == "graph_replay, dispatch"
    skipped = facts["layers skipped"].split("; ")
    assert [s.split(":")[0] for s in skipped] == ["gpu_trace", "sync_debug"] and all("CUDA" in s for s in skipped)
    with open_session(t, device="cpu", layers="off") as drv:
        assert drv.layer_facts() == {"detection layers": "none (layers off)"}  # nothing selected: nothing skipped


def test_a_step_that_spins_is_fc252_with_stacks_and_poisons_the_session() -> None:
    t = fv.SpinsInPrepareReplay(**fv.SMALL)
    steps = random_steps(t.capacity, 16, seed=5)
    with open_session(t, device="cpu", layers="off", step_timeout=0.5) as drv:
        for i, s in enumerate(steps):
            r = drv.execute(s, i)
            if r.findings:
                break
        (f,) = r.findings
        assert f.id == "FC252" and f.location.region == "prepare_replay"
        assert "faulty_verdicts.py" in str(f.evidence["threads"]) and f.evidence["timeout_s"] in (
            0.5,
            2.5,
        )  # a first replay gets the warm-up leash
        # the interrupt may have landed inside library code: this session is done, a fresh one goes on
        assert drv.poisoned
        with pytest.raises(ContextPoisoned):
            drv.execute(steps[i + 1], i + 1)
    with open_session(t, device="cpu", layers="off", step_timeout=0.5) as drv:
        assert drv.execute(steps[0], 0).findings == []


@pytest.mark.slow
def test_an_uninterruptible_hang_in_an_isolated_worker_is_fc252_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(QUALITY)
    drv = IsolatedDriver(
        "faulty_verdicts:BlocksInReplay",
        config=fv.SMALL,
        device="cpu",
        layers="off",
        step_timeout=1.0,
        warm_up_scale=2.0,  # the hung replay is the worker's first: a CPU target compiles nothing, 2 s is plenty
        setup_timeout=120.0,
    )
    steps = [
        Step("capture", (1, 1, 1, 1), (9, 17, 33, 5), bucket=4),
        Step("replay", (1, 1, 1), (9, 17, 33), bucket=4),
        Step("replay", (1,), (40,), bucket=1),
        Step("eager", (2,), (30,)),
    ]
    with drv:
        results = [drv.execute(s, i) for i, s in enumerate(steps)]
    (hang,) = results[1].findings
    assert hang.id == "FC252" and "faulty_verdicts.py" in str(hang.evidence["threads"])
    assert results[0].findings == [] and results[2].findings == [] and results[3].findings == []
    assert drv.restarts == 1


@pytest.mark.slow
def test_isolated_driver_is_quiet_on_the_clean_target() -> None:
    t = ReferenceTarget(**fv.SMALL)
    with IsolatedDriver("cpu-reference", config=fv.SMALL, device="cpu", layers="cheap") as drv:
        assert drv.layer_facts() == {}  # no worker yet
        results = [drv.execute(s, i) for i, s in enumerate(random_steps(t.capacity, 12, seed=3))]
    assert all(r.findings == [] and r.sample is not None for r in results) and drv.restarts == 0
    facts = drv.layer_facts()  # what the worker's checker ran, and skipped with why
    assert facts["detection layers"] == "graph_replay, dispatch"
    assert "sync_debug: no CUDA device" in facts["layers skipped"]


class _SetupRaises(ReferenceTarget):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def setup(self, env: object) -> None:
        raise self.exc


def test_setup_errors_are_findings_unless_the_environment_says_so() -> None:
    with pytest.raises(ViolationFound) as info, open_session(_SetupRaises(KeyError("layer 0")), device="cpu"):
        pass
    assert [f.id for f in info.value.findings] == ["FC250"]
    with (
        pytest.raises(EnvironmentUnavailable),
        open_session(
            _SetupRaises(RuntimeError("no kernel image is available for execution on the device")), device="cpu"
        ),
    ):
        pass


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("CUDA error: an illegal memory access was encountered", ("finding", "FC250", True)),
        ("CUDA error: misaligned address", ("finding", "FC250", True)),
        ("The size of indices should be less than or equal to the allocated buffer", ("finding", "FC250", False)),
        ("too many values to unpack (expected 2)", ("finding", "FC250", False)),
        ("CUDA out of memory. Tried to allocate 2.00 GiB", ("finding", "FC250", False)),
    ],
)
def test_classification_poisons_only_for_kernel_faults(message: str, expected: tuple[str, str, bool]) -> None:
    c = classify_exception(
        ValueError(message) if "indices" in message or "unpack" in message else RuntimeError(message)
    )
    assert (c.verdict, c.check_id, c.poisons_context) == expected


@pytest.mark.parametrize(
    ("shape", "dtype", "device", "problem"),
    [
        ((6, 4, 16), "torch.float32", "cpu", "+1 rows"),
        ((5, 4, 8), "torch.float32", "cpu", "expected [5, 4, 16]"),
        ((5, 4, 16), "torch.float16", "cpu", "dtype float16"),
        ((5, 4, 16), "torch.float32", "cuda:0", "is on cuda:0"),
        (None, None, None, "is not a tensor"),
    ],
)
def test_output_contract_fires(
    shape: tuple[int, ...] | None, dtype: str | None, device: str | None, problem: str
) -> None:
    (f,) = check_output_contract(
        shape,
        dtype,
        device,
        rows=5,
        heads=4,
        head_dim=16,
        want_dtype="float32",
        want_device="cpu",
        what="replay",
        location=Location(step=3),
    )
    assert f.id == "FC305" and problem in f.message


def test_output_contract_quiet_on_exact_rows() -> None:
    assert (
        check_output_contract(
            (5, 4, 16),
            "torch.float32",
            "cpu",
            rows=5,
            heads=4,
            head_dim=16,
            want_dtype="float32",
            want_device="cpu",
            what="eager",
        )
        == []
    )


@pytest.mark.slow
def test_an_isolated_worker_is_replaced_after_a_fault_and_the_steps_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(QUALITY)
    steps = fv.FAULT_THEN_GO_ON
    with IsolatedDriver("faulty_verdicts:FaultSurfacesLater", config=fv.SMALL, device="cpu", layers="off") as drv:
        results = [drv.execute(s, i) for i, s in enumerate(steps)]
    (fault,) = results[1].findings
    assert fault.id == "FC250" and fault.evidence["surfaced"] == "flashcheck read"
    assert [r.findings for r in (results[0], results[2], results[3])] == [[], [], []]
    assert drv.restarts == 1  # the poisoned worker was replaced; the bs=1 replay captured its bucket again


def test_a_replay_after_a_capture_in_the_process_gets_no_warm_up_leash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first eager and capture step of a process get the warm-up leash (imports, JIT compiles); a replay after a
    capture runs kernels the capture compiled, so a kernel that never ends is judged on the plain timeout; a replay
    before any capture in the process still gets the leash."""
    import flashcheck.driver as driver_mod

    monkeypatch.setattr(driver_mod, "_WARMED", set())
    assert driver_mod.warms_up("replay") and driver_mod.warms_up("capture") and driver_mod.warms_up("eager")
    driver_mod._WARMED.add("capture")
    assert not driver_mod.warms_up("replay") and not driver_mod.warms_up("capture")
    assert driver_mod.warms_up("eager")
