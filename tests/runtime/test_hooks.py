"""Each torch adapter on CPU: fires through the checker, stays quiet where it should, restores what it replaced."""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest
import torch

from flashcheck.runtime import Checker
from flashcheck.runtime.hooks import HookError
from flashcheck.runtime.hooks import gpu_trace as gpu_trace_mod
from flashcheck.runtime.hooks.alloc_stats import AllocStatsHook
from flashcheck.runtime.hooks.dispatch import DispatchHook
from flashcheck.runtime.hooks.gpu_trace import GpuTraceHook
from flashcheck.runtime.hooks.graph_replay import GraphReplayHook
from flashcheck.runtime.hooks.sync_debug import PROTOTYPE_TEXT, SYNC_TEXT, SyncDebugHook
from flashcheck.runtime.simdevice import as_device


def here() -> int:
    return sys._getframe(1).f_lineno


# ------------------------------------------------------------------------------------------------ sync_debug
class FakeSyncMode:
    """Stands in for torch.cuda.{get,set}_sync_debug_mode; the first arm emits the prototype warning."""

    def __init__(self, mode: int = 0) -> None:
        self.mode = mode
        self.calls: list[int] = []
        self.warned = False

    def get(self) -> int:
        return self.mode

    def set(self, mode: int) -> None:
        if mode and not self.warned:
            self.warned = True
            warnings.warn(PROTOTYPE_TEXT + " and does not yet detect all synchronizing operations", stacklevel=2)
        self.mode = mode
        self.calls.append(mode)

    def sync_op(self) -> None:
        """What torch does on .item() when the mode is armed."""
        if self.mode == 1:
            warnings.warn(SYNC_TEXT, UserWarning, stacklevel=2)


def sync_hook(fake: FakeSyncMode) -> SyncDebugHook:
    return SyncDebugHook(get_mode=fake.get, set_mode=fake.set, available=lambda: True)


def test_sync_debug_fires_in_replay_with_the_user_line() -> None:
    fake = FakeSyncMode()
    with Checker(layers=[sync_hook(fake)]) as chk:
        with chk.region("replay", step=0):
            for _ in range(3):  # the same line three times: the "always" filter keeps every occurrence
                line = here() + 1
                fake.sync_op()
        with chk.region("capture"):
            fake.sync_op()  # outside hot regions the monitor drops it
        (f,) = chk.drain_findings()
    # The fake stands in for torch, so its own frame is the innermost "user" frame; the caller is below it.
    assert f.id == "FC201" and f.evidence["count"] == 3
    assert f.location.function == "sync_op" and any(fr.line == line for fr in f.stack)
    assert fake.mode == 0


def test_sync_debug_captures_no_stack_where_nothing_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    from flashcheck.runtime.hooks import sync_debug as sync_debug_mod

    captured: list[int] = []
    real = sync_debug_mod.capture_stack

    def counting(skip: int = 1) -> Any:
        captured.append(skip)
        return real(skip + 1)

    monkeypatch.setattr(sync_debug_mod, "capture_stack", counting)
    fake = FakeSyncMode()
    with Checker(layers=[sync_hook(fake)]) as chk:
        fake.sync_op()  # no region
        with chk.region("capture"):
            fake.sync_op()
        with chk.region("replay"), chk.checker_read():
            fake.sync_op()
        assert captured == [] and chk.drain_findings() == []
        with chk.region("replay"):
            fake.sync_op()
        assert captured == [2] and [f.id for f in chk.drain_findings()] == ["FC201"]


def test_sync_debug_quiet_outside_hot_regions_and_in_checker_read() -> None:
    fake = FakeSyncMode()
    with Checker(layers=[sync_hook(fake)]) as chk:
        with chk.region("setup"):
            fake.mode = 1
            fake.sync_op()
            fake.mode = 0
        with chk.region("replay"), chk.checker_read():
            fake.sync_op()
        assert chk.drain_findings() == []


def test_sync_debug_restores_showwarning_filters_and_mode_and_chains() -> None:
    fake = FakeSyncMode()
    seen: list[str] = []

    def other_tool(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        seen.append(str(message))

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = other_tool
        filters = list(warnings.filters)
        hook = sync_hook(fake)
        with Checker(layers=[hook]) as chk:
            assert warnings.showwarning != other_tool
            with chk.region("replay"):
                warnings.warn("unrelated", UserWarning, stacklevel=1)
                fake.sync_op()
            chk.drain_findings()
        assert warnings.showwarning is other_tool and warnings.filters == filters
        assert not hook.installed
    assert seen == ["unrelated"]  # chained; the prototype warning and our own sync warning were consumed
    assert fake.calls == [1, 0]  # armed once while installed, the user's mode restored


def test_sync_debug_rehooks_after_someone_resets_showwarning() -> None:
    fake = FakeSyncMode()
    with warnings.catch_warnings(), Checker(layers=[sync_hook(fake)]) as chk:
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]  # like pytest per test
        warnings.resetwarnings()
        with chk.region("replay"):
            fake.sync_op()
        assert len(chk.drain_findings()) == 1


def test_sync_debug_keeps_a_mode_the_user_had_set() -> None:
    fake = FakeSyncMode(mode=2)
    with Checker(layers=[sync_hook(fake)]) as chk, chk.region("replay"):
        pass
    assert fake.mode == 2 and 0 not in fake.calls


# ------------------------------------------------------------------------------------------------- gpu_trace
class FakeRegistry:
    def __init__(self) -> None:
        self.callback_list: list[Any] = []

    def fire(self, *args: Any) -> None:
        for cb in self.callback_list:
            cb(*args)


def fake_registries() -> dict[str, FakeRegistry]:
    return {k: FakeRegistry() for k in ("device_sync", "stream_sync", "event_sync", "alloc")}


def test_gpu_trace_sync_and_alloc_fire_in_replay_only() -> None:
    regs = fake_registries()
    with Checker(layers=[GpuTraceHook(registries=regs, activate=lambda: None, available=lambda: True)]) as chk:
        with chk.region("replay", step=1):
            line = here() + 1
            regs["device_sync"].fire()
            regs["alloc"].fire(0x1000)
        with chk.region("capture"):
            regs["stream_sync"].fire(7)
            regs["alloc"].fire(0x2000)
        with chk.region("replay"), chk.checker_read():
            regs["event_sync"].fire(3)
        sync, alloc = chk.drain_findings()
    assert sync.id == "FC201" and "torch.cuda.synchronize" in sync.message
    assert alloc.id == "FC202"
    assert any(fr.line == line for fr in sync.stack) and any(fr.line == line + 1 for fr in alloc.stack)
    assert all(r.callback_list == [] for r in regs.values())


def test_gpu_trace_leaves_other_callbacks_in_place() -> None:
    regs = fake_registries()
    theirs = [lambda *a: None for _ in regs]
    for r, cb in zip(regs.values(), theirs, strict=True):
        r.callback_list.append(cb)
    hook = GpuTraceHook(registries=regs, activate=lambda: None, available=lambda: True)
    with Checker(layers=[hook]):
        assert all(len(r.callback_list) == 2 for r in regs.values())
    assert [r.callback_list for r in regs.values()] == [[cb] for cb in theirs]


def test_gpu_trace_on_torchs_real_registries() -> None:
    import torch.cuda._gpu_trace as gt

    before = list(gt.DeviceSynchronizationCallbacks.callback_list)
    with Checker(layers=[GpuTraceHook(activate=lambda: None, available=lambda: True)]) as chk:
        with chk.region("prepare_replay"):
            gt.DeviceSynchronizationCallbacks.fire_callbacks()
        (f,) = chk.drain_findings()
    assert f.id == "FC201" and f.location.file == __file__
    assert gt.DeviceSynchronizationCallbacks.callback_list == before


def test_gpu_trace_callback_errors_are_raised_not_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object) -> None:
        raise RuntimeError("stack capture failed")

    monkeypatch.setattr(gpu_trace_mod, "capture_stack", boom)
    regs = fake_registries()
    chk = Checker(layers=[GpuTraceHook(registries=regs, activate=lambda: None, available=lambda: True)])
    with pytest.raises(HookError, match="gpu_trace: RuntimeError: stack capture failed"), chk, chk.region("replay"):
        regs["device_sync"].fire()


# ----------------------------------------------------------------------------------------------- alloc_stats
class FakeAllocator:
    def __init__(self) -> None:
        self.allocs, self.segments, self.reserved = 0, 0, 0

    def read(self) -> tuple[int, int, int]:
        return self.allocs, self.segments, self.reserved


def test_alloc_stats_allocation_and_pool_growth_in_replay() -> None:
    a = FakeAllocator()
    with Checker(layers=[AllocStatsHook(read_stats=a.read, available=lambda: True)]) as chk:
        with chk.region("replay", step=3):
            a.allocs += 2
        with chk.region("replay", step=4):
            a.allocs += 1
            a.segments += 1
            a.reserved += 2 << 20
        with chk.region("run"):
            a.allocs += 5
        f1, f2 = chk.drain_findings()
    assert f1.id == f2.id == "FC202"
    assert f1.location.step == 3 and f1.evidence["count"] == 2
    assert f2.location.step == 4 and f2.evidence["nbytes"] == 2 << 20
    assert "pool growth" in f2.message or "allocation" in f2.message


def test_alloc_stats_subtracts_checker_reads_and_is_quiet_when_clean() -> None:
    a = FakeAllocator()
    with Checker(layers=[AllocStatsHook(read_stats=a.read, available=lambda: True)]) as chk:
        with chk.region("replay", step=0), chk.checker_read():
            a.allocs += 3
            a.segments += 1
            a.reserved += 1 << 20
        with chk.region("prepare_replay"), chk.region("plan"):
            pass
        assert chk.drain_findings() == []


# ---------------------------------------------------------------------------------------------- graph_replay
class FakeGraph:
    def replay(self) -> str:
        return "replayed"


def test_graph_replay_chains_to_a_previous_wrapper_and_restores_it() -> None:
    original = FakeGraph.__dict__["replay"]
    calls: list[str] = []

    def other_tool_replay(self: FakeGraph) -> str:
        calls.append("other")
        return original(self)

    FakeGraph.replay = other_tool_replay  # type: ignore[method-assign]
    try:
        x = as_device(torch.arange(4))
        with Checker(layers=[GraphReplayHook(FakeGraph), DispatchHook()]) as chk:
            assert FakeGraph.replay is not other_tool_replay
            g = FakeGraph()

            def replay_with_sync(self: FakeGraph) -> str:
                x.tolist()  # a sync inside replay(), outside any driver region
                return "ok"

            assert g.replay() == "replayed" and calls == ["other"]
            (f_none,) = [*chk.drain_findings(), None]
            calls.clear()
        assert FakeGraph.__dict__["replay"] is other_tool_replay
        assert f_none is None
        assert replay_with_sync(g) == "ok"
    finally:
        FakeGraph.replay = original  # type: ignore[method-assign]


def test_graph_replay_opens_an_implicit_replay_region() -> None:
    x = as_device(torch.arange(4))

    class G:
        def replay(self) -> None:
            x.tolist()

    with Checker(layers=[GraphReplayHook(G), DispatchHook()]) as chk:
        G().replay()
        (f,) = chk.drain_findings()
        with chk.region("capture"):
            G().replay()  # a driver region is open: no implicit region, and `capture` is not hot
        assert chk.drain_findings() == []
    assert f.id == "FC201" and f.location.region == "replay"
    assert "replay" in G.__dict__ and not hasattr(G.replay, "__flashcheck_wrapper__")


def test_graph_replay_stays_inert_when_another_tool_wrapped_on_top() -> None:
    class G:
        def replay(self) -> str:
            return "r"

    hook = GraphReplayHook(G)
    with Checker(layers=[hook]):
        ours = G.replay

        def theirs(self: G) -> str:
            return ours(self)

        G.replay = theirs  # type: ignore[method-assign]
    assert G.replay is theirs and hook.stranded == [ours] and G().replay() == "r"


def test_graph_replay_restores_torchs_cudagraph_replay_exactly() -> None:
    before = torch.cuda.CUDAGraph.__dict__.get("replay")
    with Checker(layers=[GraphReplayHook()]):
        assert torch.cuda.CUDAGraph.__dict__.get("replay") is not before
    assert torch.cuda.CUDAGraph.__dict__.get("replay") is before
