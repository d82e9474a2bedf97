"""The scenario driver on the CPU reference target: clean runs are quiet, each faulty variant is found by its
intended property, scenarios round-trip, bad steps get clear errors, target errors are classified."""

from __future__ import annotations

import pytest

from flashcheck.errors import ContextPoisoned, EnvironmentUnavailable, InvalidArgument
from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.scenario import Scenario, Step
from flashcheck.session import open_session
from flashcheck.targets.classify import classify_exception
from flashcheck.targets.reference import ReferenceTarget
from tests.quality.seed_bugs_cpu import CPU_SEED_BUGS


def run(target: ReferenceTarget, steps: list[Step]) -> list[list[str]]:
    with open_session(target, device="cpu", layers="off", seed=1) as drv:
        return [[f.id for f in drv.execute(s, i).findings] for i, s in enumerate(steps)]


def test_clean_reference_target_is_quiet() -> None:
    t = ReferenceTarget()
    steps = random_steps(t.capacity, 40, seed=11)
    assert {s.op for s in steps} == {"capture", "replay", "eager"}
    assert run(t, steps) == [[] for _ in steps]


@pytest.mark.parametrize("name", sorted(CPU_SEED_BUGS))
def test_each_faulty_variant_is_found_by_its_property(name: str) -> None:
    cls = CPU_SEED_BUGS[name]
    t = cls()
    per_step = run(t, random_steps(t.capacity, 40, seed=5))
    first = next((i for i, ids in enumerate(per_step) if ids), None)
    assert first is not None, f"{name} not found in 40 steps"
    assert cls.intended in per_step[first], per_step[first]


def test_scenario_json_round_trip() -> None:
    t = ReferenceTarget()
    sc = Scenario("cpu-reference", tuple(random_steps(t.capacity, 10, seed=2)), seed=9, target_config={"chunk": 32})
    assert Scenario.from_dict(sc.to_dict()) == sc
    with pytest.raises(InvalidArgument, match="step op 'jump'"):
        Step("jump", (1,), (1,))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="with 'target' and 'steps'"):
        Scenario.from_dict({"steps": []})


@pytest.mark.parametrize(
    ("step", "match"),
    [
        (Step("eager", (1,) * 9, (5,) * 9), "batch size 9 > max_batch_size 8"),
        (Step("eager", (17,), (40,)), "qo_len 17 > max_qo_len 16"),
        (Step("replay", (1, 1, 1), (4, 4, 4), bucket=2), "bucket 2 is smaller than the batch size 3"),
        (Step("replay", (1,), (4,), bucket=3), r"captures \[1, 2, 4, 8\]"),
    ],
)
def test_steps_that_do_not_fit_get_clear_errors(step: Step, match: str) -> None:
    with (
        open_session(ReferenceTarget(), device="cpu", layers="off") as drv,
        pytest.raises(InvalidArgument, match=match),
    ):
        drv.execute(step, 0)


class _Raises(ReferenceTarget):
    def __init__(self, exc: BaseException) -> None:
        super().__init__()
        self.exc = exc

    def run(self, q: object) -> object:
        raise self.exc


def test_target_errors_go_through_the_classification_table() -> None:
    step = Step("eager", (1,), (5,))
    with open_session(
        _Raises(ValueError("batch size 3 does not match the cuda graph mode batch size 4")), device="cpu", layers="off"
    ) as drv:
        r = drv.execute(step, 0)  # a backend's ValueError on a step inside the capacity: a finding, never a skip
        assert r.rejected is None and [f.id for f in r.findings] == ["FC250"]
    with open_session(_Raises(KeyError("stale request id")), device="cpu", layers="off") as drv:
        (f,) = drv.execute(step, 0).findings
        assert f.id == "FC250" and f.stack and "KeyError" in f.message
    with open_session(
        _Raises(RuntimeError("CUDA error: an illegal memory access was encountered")), device="cpu", layers="off"
    ) as drv:
        (f,) = drv.execute(step, 0).findings
        assert f.id == "FC250" and drv.poisoned and f.location.region == "run"
        with pytest.raises(ContextPoisoned, match="restart"):
            drv.execute(step, 1)
    with (
        open_session(
            _Raises(RuntimeError("no kernel image is available for execution on the device")),
            device="cpu",
            layers="off",
        ) as drv,
        pytest.raises(EnvironmentUnavailable),
    ):
        drv.execute(step, 0)


class _Declares(ReferenceTarget):
    def accepts(self, spec: object) -> str | None:
        return "odd batch sizes are not supported" if len(spec.kv_lens) % 2 else None  # type: ignore[attr-defined]


def test_only_a_declared_input_contract_rejects_a_step() -> None:
    with open_session(_Declares(), device="cpu", layers="off") as drv:
        odd = drv.execute(Step("eager", (1,), (5,)), 0)
        even = drv.execute(Step("eager", (1, 1), (5, 9)), 1)
    assert odd.rejected is not None and "odd batch sizes" in odd.rejected and odd.sample is None
    assert even.rejected is None and even.findings == [] and even.sample is not None


@pytest.mark.parametrize(
    ("exc", "verdict", "check"),
    [
        (
            RuntimeError(
                "Error in function 'aligned_alloc' at allocator.h:49: Buffer overflow when allocating memory "
                "for batch_prefill_tmp_v with size 69206016"
            ),
            "finding",
            "FC302",
        ),
        (
            ValueError(
                "The total number of rows in qo_indptr 128 in cuda graph mode cannot exceed the number of rows "
                "set during initialization 64."
            ),
            "finding",
            "FC250",
        ),
        (RuntimeError("CUDA error: device-side assert triggered"), "finding", "FC250"),
        (NotImplementedError("workspace_size is not implemented for cudnn"), "environment", None),
        # FlashInfer 0.7.2's fa3 prefill JIT build failed on the H100 (reports/gpu-evidence.md): the machine, not
        # the code under test
        (RuntimeError("Ninja build failed. Ninja output:"), "environment", None),
        (TypeError("unexpected keyword"), "finding", "FC250"),
    ],
)
def test_classification_table(exc: BaseException, verdict: str, check: str | None) -> None:
    c = classify_exception(exc)
    assert c.verdict == verdict and c.check_id == check


def test_runtime_findings_name_the_target() -> None:
    """Findings drained from the checker carry the target (the H100 campaign summary showed them without one)."""
    from tests.quality.seed_bugs_cpu import UndersizedWorkspace

    t = UndersizedWorkspace()
    with open_session(t, device="cpu", layers="off", seed=1) as drv:
        found = [f for i, s in enumerate(random_steps(t.capacity, 40, seed=5)) for f in drv.execute(s, i).findings]
    assert found and all(f.location.target == t.name for f in found)


def test_fc303_copies_device_outputs_to_the_host_to_explain_a_divergence(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the GPU the eager output and the fp32 reference stay on the device, and numpy cannot read a CUDA tensor:
    the comparison that explains a failed screen must copy both to the host itself. Tensors tracked by autograd,
    which numpy refuses too, stand in for device tensors here (CI has no GPU)."""
    from flashcheck.driver import Driver

    base = CPU_SEED_BUGS["query-frozen-at-capture"]

    class Tracked(base):  # type: ignore[misc, valid-type]
        def run(self, q: object) -> object:
            return super().run(q).requires_grad_()

    reference = Driver._reference
    monkeypatch.setattr(Driver, "_reference", lambda self, q, layout: reference(self, q, layout).requires_grad_())
    t = Tracked()
    per_step = run(t, random_steps(t.capacity, 40, seed=5))
    assert any("FC303" in ids for ids in per_step), per_step
