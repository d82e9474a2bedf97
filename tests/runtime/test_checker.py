"""The Checker: life cycle, off-costs-nothing, regions, arena integration, torch-free import."""

from __future__ import annotations

import subprocess
import sys
import warnings
from typing import Any

import pytest
import torch
import torch.cuda._gpu_trace as gt

from flashcheck.errors import InvalidArgument, UsageError
from flashcheck.runtime import Checker
from flashcheck.runtime.api import ArenaLike, CheckerLike
from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Monitor, RegionRecord
from flashcheck.runtime.simdevice import as_device


def snapshot() -> tuple[object, ...]:
    return (
        warnings.showwarning,
        list(warnings.filters),
        torch.cuda.CUDAGraph.__dict__.get("replay"),
        torch._C._len_torch_dispatch_stack(),
        tuple(list(r.callback_list) for r in (gt.DeviceSynchronizationCallbacks, gt.MemoryAllocationCallbacks)),
    )


@pytest.mark.parametrize("layers", ["cheap", "all"])
def test_an_inactive_checker_has_nothing_installed(layers: str) -> None:
    from flashcheck.runtime.hooks.dispatch import _warm_up

    # the first op under a dispatch mode imports torch's lazy modules, and sympy adds a warning filter of its own
    # when imported: torch's import, done once per process, not something the checker installed
    _warm_up()
    before = snapshot()
    chk = Checker(layers=layers)  # type: ignore[arg-type]
    assert snapshot() == before  # constructing installs nothing
    with chk:
        assert chk.active
    assert snapshot() == before and not chk.active


def test_protocols_are_implemented() -> None:
    chk = Checker()
    assert isinstance(chk, CheckerLike) and isinstance(chk.arena, ArenaLike)


def test_layers_that_cannot_run_here_are_reported_not_hidden() -> None:
    with Checker(layers="races") as chk:
        if not torch.cuda.is_available():
            assert set(chk.skipped_layers) == {"sync_debug", "gpu_trace", "cupti", "staging"}
            assert all("CUDA" in r for r in chk.skipped_layers.values())
        assert {"dispatch", "graph_replay"} <= set(chk.active_layers)


def test_usage_errors() -> None:
    chk = Checker(layers=["dispatch"])
    with pytest.raises(UsageError, match="not active"), chk.region("replay"):
        pass
    with chk:
        with pytest.raises(InvalidArgument, match="not one of"), chk.region("decode"):  # type: ignore[arg-type]
            pass
        with pytest.raises(UsageError, match="already active"):
            chk.__enter__()
    with pytest.raises(InvalidArgument, match="unknown detection layer"):
        Checker(layers=["nope"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="selected twice"):
        Checker(layers=["dispatch", "dispatch"])
    with pytest.raises(InvalidArgument, match="use 'cheap', 'all'"):
        Checker(layers="some")  # type: ignore[arg-type]


def test_arena_scan_findings_are_drained_and_scan_reads_do_not_count() -> None:
    with Checker(layers=["dispatch"], guard_bytes=256) as chk:
        ws = chk.arena.workspace("float", 1_000, device="cpu")
        chk.arena.arm()
        with chk.region("replay", step=1):
            ws.as_strided((1_010,), (1,))[1_005] = 1  # the "kernel" overflows by 6 bytes
            findings, usage = chk.arena.scan(step=1)  # scanning inside the region is a checker read
        drained = chk.drain_findings()
    assert [f.id for f in findings] == ["FC302"] and usage == {"float": (1_006, 1_000)}
    assert drained == findings


def test_a_mixed_step_gives_one_finding_per_problem() -> None:
    x = as_device(torch.arange(16))
    with Checker(layers=["dispatch"]) as chk:
        for step in range(3):
            with chk.region("prepare_replay", step=step):
                lens = x[:4]
                if step == 2:
                    lens.tolist()  # the planted bug
            with chk.region("replay", step=step):
                x.mul_(1)
        findings = chk.drain_findings()
    assert [(f.id, f.location.step) for f in findings] == [("FC201", 2)]
    assert chk.drain_findings() == []


def test_a_hook_error_on_exit_does_not_mask_the_users_exception() -> None:
    from flashcheck.runtime.hooks import dispatch as mod

    chk = Checker(layers=["dispatch"])
    orig = mod.classify
    mod.classify = lambda *a: 1 / 0  # type: ignore[assignment,assignment]
    try:
        with pytest.raises(KeyError), chk:
            with chk.region("replay"):
                as_device(torch.arange(2)).tolist()
            raise KeyError("user")
    finally:
        mod.classify = orig


def test_import_is_torch_free() -> None:
    code = (
        "import sys, flashcheck, flashcheck.runtime\n"
        "from flashcheck.runtime import Checker, Monitor\n"
        "import flashcheck.runtime.checker, flashcheck.runtime.hooks, flashcheck.runtime.arena\n"
        "from flashcheck.catalogue import all_checks; all_checks()\n"
        "c = Checker(layers='all')\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class CountingHook(Hook):
    """A layer that records the region notifications it gets; `names` narrows them as `region_names` says."""

    layer = "graph_replay"

    def __init__(self, names: frozenset[str] | None) -> None:
        super().__init__()
        self.names = names
        self.calls: list[tuple[str, str, bool]] = []
        self.refreshed = 0

    def _install(self, sink: EventSink) -> None:
        return None

    def _uninstall(self) -> None:
        return None

    def region_names(self) -> frozenset[str] | None:
        return self.names

    def refresh(self) -> None:
        self.refreshed += 1

    def region_enter(self, rec: RegionRecord, hot: bool) -> None:
        self.calls.append(("enter", rec.name, hot))

    def region_exit(self, rec: RegionRecord, hot: bool) -> None:
        self.calls.append(("exit", rec.name, hot))


class OtherCountingHook(CountingHook):
    layer = "staging"  # a checker takes each layer once


class ThirdCountingHook(CountingHook):
    layer = "dispatch"


def test_a_hook_is_called_only_for_the_regions_it_names_and_refreshed_at_each_outermost_region() -> None:
    every, capture = CountingHook(None), OtherCountingHook(frozenset({"capture"}))
    with Checker(layers=[every, capture], device="cpu") as chk:
        with chk.region("capture"), chk.region("plan"):
            pass
        with chk.region("replay", step=1):
            pass
    assert capture.calls == [("enter", "capture", False), ("exit", "capture", False)]
    assert every.calls == [
        ("enter", "capture", False),
        ("enter", "plan", True),
        ("exit", "plan", True),
        ("exit", "capture", False),
        ("enter", "replay", True),
        ("exit", "replay", True),
    ]
    assert every.refreshed == capture.refreshed == 2  # `capture` and `replay` opened with nothing around them


def test_a_hook_failing_on_enter_is_unwound_and_the_region_closed() -> None:
    class Failing(OtherCountingHook):
        def region_enter(self, rec: RegionRecord, hot: bool) -> None:
            raise RuntimeError("enter broke")

    first, broken, last = CountingHook(None), Failing(None), ThirdCountingHook(None)
    with Checker(layers=[first, broken, last], device="cpu") as chk:
        with pytest.raises(RuntimeError, match="enter broke"), chk.region("replay"):
            pass
        assert not chk.monitor.any_open
    assert first.calls == [("enter", "replay", True), ("exit", "replay", True)] and last.calls == []


@pytest.mark.parametrize("deferred", [False, True])
def test_closed_regions_are_kept_only_for_layers_that_report_later(deferred: bool) -> None:
    mon = Monitor(record_region_stacks=deferred)
    outer = mon.enter("replay", step=1)
    inner = mon.enter("plan", step=1)
    assert (inner.hot, inner.graph_hot, inner.enclosing) == ("replay", "replay", ("replay",))
    mon.exit(inner)
    mon.exit(outer)
    assert (mon.region(outer.id) is outer) is deferred
    mon.drain()
    assert mon.region(outer.id) is None


class _Unavailable(Hook):
    layer = "cupti"

    def unavailable_reason(self) -> str | None:
        return "cupti-python is not installed"


def test_a_layer_skipped_on_a_cuda_machine_is_warned_about_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.runtime import checker as checker_mod

    monkeypatch.setattr(checker_mod, "_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        with Checker(layers=[_Unavailable()]) as chk:  # no device: every CUDA layer is skipped by design
            assert chk.skipped_layers == {"cupti": "cupti-python is not installed"}
        assert caught == []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        for _ in range(2):
            with Checker(layers=[_Unavailable()]):
                pass
    (w,) = caught  # once per layer and reason in a process
    assert w.category is RuntimeWarning and w.filename == __file__
    assert str(w.message) == (
        "flashcheck: detection layer 'cupti' is skipped on this CUDA machine: cupti-python is not installed; what "
        "only it sees is not watched in this run (Checker.skipped_layers lists it)"
    )


class _ReadHook(Hook):
    """Records the checker's reads; `fail` makes read_begin raise."""

    layer = "alloc_stats"

    def __init__(self, log: list[str], fail: bool = False) -> None:
        super().__init__()
        self.log, self.fail = log, fail

    def _install(self, sink: Any) -> None:
        pass

    def _uninstall(self) -> None:
        pass

    def read_begin(self) -> None:
        self.log.append("begin")
        if self.fail:
            raise RuntimeError("read_begin failed")

    def read_end(self) -> None:
        self.log.append("end")


def test_checker_reads_nest_reach_the_hooks_that_watch_reads_and_unwind_after_a_failure() -> None:
    log: list[str] = []
    with Checker(layers=[_ReadHook(log)]) as chk:
        with chk.checker_read():
            assert chk.reading()
            with chk.checker_read():
                assert chk.reading()
            assert chk.reading() and log == ["begin", "begin", "end"]
        assert not chk.reading() and log == ["begin", "begin", "end", "end"]
    log.clear()
    with Checker(layers=[_ReadHook(log, fail=True)]) as chk:
        with pytest.raises(RuntimeError, match="read_begin failed"), chk.checker_read():
            pass
        assert not chk.reading() and log == ["begin"]  # nothing begun to end; the read itself is over
    plain = Checker(layers=["graph_replay"])  # a hook that ignores reads is never called for them
    with plain as chk, chk.checker_read():
        assert chk.reading() and chk._readers == ()
