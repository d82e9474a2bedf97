"""Async pressure (``--async-pressure-us``): validation, off costs nothing, the driver delays before each host-side
preparation step and outside every region."""

from __future__ import annotations

import pytest

from flashcheck.cli import main
from flashcheck.errors import InvalidArgument
from flashcheck.pressure import AsyncPressure, parse_pressure_us
from flashcheck.scenario import Step
from flashcheck.session import open_session
from flashcheck.targets.reference import ReferenceTarget


@pytest.mark.parametrize(("raw", "want"), [(None, None), ("0", None), (0, None), ("250", 250.0), (12.5, 12.5)])
def test_valid_values(raw: object, want: float | None) -> None:
    assert parse_pressure_us(raw) == want


@pytest.mark.parametrize("raw", ["abc", "-1", "nan", "inf", "2e6", ""])
def test_bad_values_are_one_line_usage_errors_naming_the_option(raw: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^--async-pressure-us ") as exc:
        parse_pressure_us(raw)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("cmd", [["fuzz"], ["campaign", "--target", "cpu-reference", "--steps", "1"]])
def test_the_clis_reject_a_bad_value_with_exit_2(cmd: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*cmd, "--async-pressure-us", "fast"]) == 2
    assert "--async-pressure-us 'fast'" in capsys.readouterr().err


def test_off_or_on_the_cpu_does_nothing() -> None:
    assert not AsyncPressure(None, device="cuda").active
    assert not AsyncPressure(0, device="cuda").active
    assert not AsyncPressure(100, device="cpu").active
    AsyncPressure(100, device="cpu").before_host_prep()  # no torch.cuda call on the CPU


class _Recording:
    """Stands in for the driver's pressure: records which regions were open at each delay."""

    def __init__(self, checker: object) -> None:
        self.checker = checker
        self.calls: list[tuple[str, ...]] = []

    def before_host_prep(self) -> None:
        self.calls.append(tuple(r.name for r in self.checker.monitor.open_regions))  # type: ignore[attr-defined]


def test_the_driver_delays_before_plan_and_prepare_replay_outside_regions() -> None:
    with open_session(ReferenceTarget(), device="cpu", layers="cheap", seed=1, async_pressure_us=50) as drv:
        rec = _Recording(drv.checker)
        drv.pressure = rec  # type: ignore[assignment]
        drv.execute(Step("eager", (1, 1), (5, 9)), 0)
        assert rec.calls == [()]
        drv.execute(Step("capture", (1,), (7,), bucket=2), 1)
        assert rec.calls == [()]  # a capture is not a per-step preparation
        drv.execute(Step("replay", (1, 1), (3, 17), bucket=2), 2)
        assert rec.calls == [(), ()]


def test_a_reproducer_keeps_the_pressure_it_was_found_under(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.findings import Finding
    from flashcheck.repro import make_repro, replay_repro
    from flashcheck.scenario import Scenario

    scen = Scenario("cpu-reference", [Step("eager", (1,), (5,))], seed=3)
    f = Finding(id="FC303", name="replay-matches-eager", kind="property", message="m")
    assert "async_pressure_us" not in make_repro(scen, 0, f)
    repro = make_repro(scen, 0, f, async_pressure_us=250.0)
    assert repro["async_pressure_us"] == 250.0
    seen: dict[str, object] = {}

    def fake_run(scenario: Scenario, **kw: object) -> list[object]:
        seen.update(kw)
        return []

    monkeypatch.setattr("flashcheck.session.run_scenario", fake_run)
    replay_repro(repro, device="cpu", isolate=False)
    assert seen["async_pressure_us"] == 250.0
