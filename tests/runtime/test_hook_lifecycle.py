"""The adapters' life cycle driven directly: the sync debug mode armed per hot region and its warnings routed and
chained, the dispatch mode pushed and popped, the replay wrapper restored, the layer selection, and a hook's errors."""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from flashcheck.errors import InvalidArgument
from flashcheck.runtime import Checker
from flashcheck.runtime.hooks import LAYER_NAMES, build_hooks
from flashcheck.runtime.hooks.base import Hook
from flashcheck.runtime.hooks.dispatch import DispatchHook
from flashcheck.runtime.hooks.gpu_trace import GpuTraceHook
from flashcheck.runtime.hooks.graph_replay import GraphReplayHook
from flashcheck.runtime.hooks.sync_debug import PROTOTYPE_TEXT, SYNC_TEXT, SyncDebugHook
from flashcheck.runtime.monitor import Event, Monitor
from tests.runtime.test_hook_events import RecordingSink, gpu_trace


# ----------------------------------------------------------------------------------------------------- sync_debug
class Mode:
    """torch.cuda.{get,set}_sync_debug_mode; `sync()` is what torch does on a synchronizing op when armed."""

    def __init__(self, mode: int = 0, warn_on_arm: str = "") -> None:
        self.mode, self.warn_on_arm = mode, warn_on_arm
        self.calls: list[int] = []

    def get(self) -> int:
        return self.mode

    def set(self, mode: int) -> None:
        if mode and self.warn_on_arm:
            warnings.warn(self.warn_on_arm, UserWarning, stacklevel=2)
        self.mode = mode
        self.calls.append(mode)

    def sync(self) -> None:
        if self.mode:
            warnings.warn(SYNC_TEXT, UserWarning, stacklevel=2)


def sync_debug(mode: Mode, sink: RecordingSink | None = None) -> tuple[SyncDebugHook, RecordingSink]:
    """The hook installed on a sink that says a hot region is open (the hook reports only there)."""
    if sink is None:
        sink = RecordingSink()
        sink.hot = True
    hook = SyncDebugHook(get_mode=mode.get, set_mode=mode.set, available=lambda: True)
    hook.install(sink)
    return hook, sink


def test_sync_debug_arms_for_the_whole_installation_and_restores_the_users_mode() -> None:
    mode = Mode()
    with warnings.catch_warnings():
        hook, _ = sync_debug(mode)
        assert mode.calls == [1] and mode.mode == 1  # armed once, at install
        assert type(hook).region_enter is Hook.region_enter  # opening a region costs this layer nothing
        hook.uninstall()
    assert mode.calls == [1, 0] and mode.mode == 0
    for users in (1, 2):  # the user's own "warn" or "error": left alone
        theirs = Mode(mode=users)
        with warnings.catch_warnings():
            hook, _ = sync_debug(theirs)
            hook.uninstall()
        assert theirs.calls == [] and theirs.mode == users


def test_sync_debug_only_other_warnings_escape_the_install() -> None:
    mode = Mode(warn_on_arm="a warning of the user's own")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        hook, _ = sync_debug(mode)
        hook.uninstall()
    assert [str(w.message) for w in seen] == ["a warning of the user's own"]


def test_sync_debug_event_and_chaining_when_the_user_armed_the_mode() -> None:
    calls: list[tuple[Any, ...]] = []
    with warnings.catch_warnings():
        warnings.showwarning = lambda *a: calls.append(a)
        hook, sink = sync_debug(Mode(mode=1))
        hook._showwarning(UserWarning(SYNC_TEXT), UserWarning, "engine.py", 12, None, "x.item()")
        hook._showwarning(UserWarning("other"), RuntimeWarning, "a.py", 3, "f", "src")
        hook._showwarning(UserWarning(PROTOTYPE_TEXT), UserWarning, "b.py", 4, None, None)  # consumed
        hook.uninstall()
    assert [(e.kind, e.layer, e.detail, e.thread) for e in sink.events] == [
        ("sync", "sync_debug", "synchronizing CUDA operation (sync debug mode)", threading.get_ident())
    ]
    assert [(str(a[0]), *a[1:]) for a in calls] == [
        (SYNC_TEXT, UserWarning, "engine.py", 12, None, "x.item()"),  # the user's own "warn" mode still warns
        ("other", RuntimeWarning, "a.py", 3, "f", "src"),
    ]


def test_sync_debug_consumes_the_warnings_of_its_own_arming() -> None:
    calls: list[tuple[Any, ...]] = []
    with warnings.catch_warnings():
        warnings.showwarning = lambda *a: calls.append(a)
        hook, sink = sync_debug(Mode())
        hook._showwarning(UserWarning(SYNC_TEXT), UserWarning, "engine.py", 12, None, None)
        hook.uninstall()
    assert len(sink.events) == 1 and calls == []


def test_sync_debug_chains_to_the_default_through_the_recorder_catch_warnings_installs() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        hook, _ = sync_debug(Mode())
        hook._showwarning(UserWarning("other"), RuntimeWarning, "a.py", 3, "f", "src")
        hook.uninstall()
        hook._showwarning(UserWarning("after"), UserWarning, "b.py", 4, None, None)  # a reference kept by someone
    assert [(str(w.message), w.category, w.filename, w.lineno, w.file, w.line) for w in seen] == [
        ("other", RuntimeWarning, "a.py", 3, "f", "src"),
        ("after", UserWarning, "b.py", 4, None, None),
    ]


def test_sync_debug_hands_its_own_failure_to_the_checker() -> None:
    class Broken(RecordingSink):
        def emit(self, event: Event) -> None:
            raise ValueError("sink broke")

    broken = Broken()
    broken.hot = True
    with warnings.catch_warnings():
        hook, sink = sync_debug(Mode(), broken)
        hook._showwarning(UserWarning(SYNC_TEXT), UserWarning, "engine.py", 12, None, None)
        hook.uninstall()
    assert [(layer, str(e)) for layer, e in sink.errors] == [("sync_debug", "sink broke")]


@pytest.mark.parametrize("reset", ["showwarning", "filters"])
def test_sync_debug_rehooks_when_either_half_was_reset(reset: str) -> None:
    mode = Mode()
    with warnings.catch_warnings():
        warnings.resetwarnings()
        hook, sink = sync_debug(mode)
        if reset == "showwarning":
            warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        else:
            warnings.filters.remove(hook._filter)  # type: ignore[attr-defined]
        hook.refresh()
        for _ in range(3):
            mode.sync()  # one line, three times: counted three times only with the "always" filter
        hook.uninstall()
    assert len(sink.events) == 3


def test_sync_debug_rehooks_when_the_filter_list_is_replaced_by_one_of_the_same_length() -> None:
    mode = Mode()
    with warnings.catch_warnings():
        warnings.resetwarnings()
        hook, sink = sync_debug(mode)
        hook.refresh()  # nothing changed: the fast path
        n = len(warnings.filters)
        other = ("default", None, Warning, None, 0)
        warnings.filters = [f for f in warnings.filters if f is not hook._filter] + [other]
        assert len(warnings.filters) == n  # a new list of the same length, without the "always" filter
        hook.refresh()
        hook.refresh()
        for _ in range(3):
            mode.sync()
        hook.uninstall()
    assert len(sink.events) == 3


def test_sync_debug_is_rehooked_when_an_outermost_region_opens() -> None:
    mode = Mode()
    hook = SyncDebugHook(get_mode=mode.get, set_mode=mode.set, available=lambda: True)
    with warnings.catch_warnings(), Checker(layers=[hook], device="cpu") as chk:
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]  # what pytest does
        with chk.region("replay", step=1):
            mode.sync()
        mode.sync()  # outside every region: dropped
        findings = chk.drain_findings()
        # the next test numbers its steps from where this one did: a reset between them is still noticed
        warnings.showwarning = warnings._showwarning_orig  # type: ignore[attr-defined]
        with chk.region("prepare_replay", step=1):
            mode.sync()
        findings += chk.drain_findings()
    assert [(f.id, f.location.step, f.location.region, f.evidence["layers"]) for f in findings] == [
        ("FC201", 1, "replay", ["sync_debug"]),
        ("FC201", 1, "prepare_replay", ["sync_debug"]),
    ]


def test_sync_debug_leaves_a_showwarning_installed_after_it_alone() -> None:
    def theirs(*a: Any) -> None:
        return None

    with warnings.catch_warnings():
        hook, _ = sync_debug(Mode())
        warnings.showwarning = theirs
        hook.uninstall()
        assert warnings.showwarning is theirs


def test_sync_debug_reads_and_sets_torchs_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    state = {"mode": 2}
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: state["mode"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda m: state.update(mode=m))
    hook = SyncDebugHook(available=lambda: True)
    assert hook._get_mode() == 2
    hook._set_mode(1)
    assert state["mode"] == 1
    assert SyncDebugHook(available=lambda: False).unavailable_reason() == "no CUDA device"
    assert SyncDebugHook(available=lambda: True).unavailable_reason() is None
    if not torch.cuda.is_available():
        assert SyncDebugHook().unavailable_reason() == "no CUDA device (sync debug mode needs one)"


# ---------------------------------------------------------------------------------------- graph_replay, build_hooks
class Base:
    def replay(self) -> str:
        return "base"


def test_graph_replay_on_an_inherited_replay_removes_its_own_attribute_on_uninstall() -> None:
    class Graph(Base):
        pass

    opened: list[str] = []

    class Sink(RecordingSink):
        @contextlib.contextmanager
        def implicit_region(self, name: str) -> Iterator[None]:
            opened.append(name)
            yield

    hook, sink = GraphReplayHook(owner=Graph), Sink()
    hook.install(sink)
    assert "replay" in Graph.__dict__ and Graph.replay.__flashcheck_wrapper__ is True  # type: ignore[attr-defined]
    assert Graph().replay() == "base" and opened == ["replay"]
    sink.open = True  # the driver's own region is open: the replay runs inside it, no implicit one
    assert Graph().replay() == "base" and opened == ["replay"]
    hook.uninstall()
    assert "replay" not in Graph.__dict__ and Graph.replay is Base.replay and Graph().replay() == "base"
    assert hook._wrapper is None and hook.stranded == []


def test_graph_replay_left_in_another_tools_chain_is_inert() -> None:
    class Graph(Base):
        pass

    opened: list[str] = []

    class Sink(RecordingSink):
        @contextlib.contextmanager
        def implicit_region(self, name: str) -> Iterator[None]:
            opened.append(name)
            yield

    hook = GraphReplayHook(owner=Graph)
    hook.install(Sink())
    ours = Graph.replay
    Graph.replay = lambda g: "theirs:" + ours(g)  # type: ignore[method-assign]
    hook.uninstall()
    assert hook.stranded == [ours] and Graph().replay() == "theirs:base" and opened == []


def test_build_hooks_for_each_selection() -> None:
    cheap = build_hooks("cheap", device="cuda:1")
    assert [h.layer for h in cheap] == ["sync_debug", "gpu_trace", "graph_replay", "dispatch"]
    assert isinstance(cheap[-1], DispatchHook) and cheap[-1].scope == "capture"
    every = build_hooks("all", device="cuda:1")
    layers = [h.layer for h in every]
    assert layers == ["sync_debug", "gpu_trace", "graph_replay", "dispatch", "cupti"]
    assert every[3].scope == "capture"  # type: ignore[attr-defined]  # CUPTI sees what dispatch would in hot regions
    races = [h.layer for h in build_hooks("races")]
    assert races == ["sync_debug", "gpu_trace", "graph_replay", "dispatch", "staging", "cupti"]
    dispatch = every[3]
    dispatch.layers_skipped({"cupti": "no CUDA device"})  # CUPTI cannot run here: dispatch watches hot regions
    assert dispatch.scope == "hot+capture"  # type: ignore[attr-defined]
    dispatch.install(RecordingSink())
    dispatch.uninstall()
    assert dispatch.scope == "capture"  # type: ignore[attr-defined]  # and leaves them to CUPTI next time
    dispatch.layers_skipped({"alloc_stats": "no CUDA device"})
    assert dispatch.scope == "capture"  # type: ignore[attr-defined]
    cheap[-1].layers_skipped({"cupti": "no CUDA device"})  # cheap never watches hot regions
    assert cheap[-1].scope == "capture"
    witness = build_hooks(["alloc_stats"], device="cuda:1")
    assert witness[0]._device == "cuda:1"  # type: ignore[attr-defined]
    mine = GpuTraceHook(available=lambda: True)
    chosen = build_hooks(["dispatch", mine, "cupti"])
    assert chosen[1] is mine and chosen[0].scope == "hot+capture"  # type: ignore[attr-defined]
    assert [type(h).__name__ for h in build_hooks(list(LAYER_NAMES))] == [
        "SyncDebugHook",
        "DispatchHook",
        "GpuTraceHook",
        "CuptiHook",
        "AllocStatsHook",
        "GraphReplayHook",
        "StagingHook",
    ]


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ("fast", "layers='fast': use 'cheap', 'all', 'races' or a list of sync_debug, dispatch, gpu_trace, cupti"),
        (["dispatch", "nvtx"], "unknown detection layer 'nvtx'; known: sync_debug, dispatch, gpu_trace, cupti"),
        (["cupti", "dispatch", "cupti", "dispatch"], r"detection layer\(s\) cupti, dispatch selected twice"),
    ],
)
def test_build_hooks_rejects_bad_selections(layers: Any, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        build_hooks(layers)


# ------------------------------------------------------------------------------------------------------- dispatch
def dispatch(monkeypatch: pytest.MonkeyPatch, capturing: bool | None) -> tuple[DispatchHook, RecordingSink]:
    from flashcheck.runtime.hooks import dispatch as dispatch_mod

    monkeypatch.setattr(dispatch_mod, "_stream_capturing", lambda: capturing)
    hook, sink = DispatchHook(at_stream_capture=False), RecordingSink()  # torch's CUDAGraph stays unwrapped
    hook.install(sink)
    return hook, sink


HOST_T = torch.arange(4)


@pytest.mark.parametrize("capturing", [None, False, True])
def test_dispatch_event_fields_and_the_pinned_copy_it_skips_outside_capture(
    monkeypatch: pytest.MonkeyPatch, capturing: bool | None
) -> None:
    from flashcheck.runtime.simdevice import as_pinned

    hook, sink = dispatch(monkeypatch, capturing)
    hook._observe("aten::_to_copy", (HOST_T,), {"device": "cuda"})
    hook._observe("aten::_to_copy", (as_pinned(HOST_T),), {"device": "cuda"})
    hook._observe("aten::add", (HOST_T, HOST_T), {})
    got = [(e.kind, e.layer, e.memory, e.detail, e.thread, e.capturing) for e in sink.events]
    pageable = ("h2d_copy", "dispatch", "pageable", "aten._to_copy from pageable host memory to the device")
    pinned = ("h2d_copy", "dispatch", "pinned", "aten._to_copy from pinned host memory to the device")
    me = threading.get_ident()
    expected = [(*pageable, me, capturing)] + ([] if capturing is False else [(*pinned, me, capturing)])
    assert got == expected
    assert all(e.stack for e in sink.events)
    sink.read = True
    hook._observe("aten::_to_copy", (HOST_T,), {"device": "cuda"})
    assert len(sink.events) == len(expected)


def test_dispatch_mode_stays_pushed_until_the_region_that_pushed_it_closes() -> None:
    hook, sink = DispatchHook(scope="capture"), RecordingSink()
    hook.install(sink)
    mon = Monitor()
    capture = mon.enter("capture")
    inner = mon.enter("plan")
    hot_only = Monitor().enter("replay")
    hook.region_enter(hot_only, True)
    assert hook._mode is None  # scope "capture": hot regions alone do not push it
    hook.region_enter(capture, False)
    hook.region_enter(inner, False)
    hook.region_exit(inner, False)
    assert hook._mode is not None
    assert torch.arange(6).reshape(2, 3).sum(dim=1, keepdim=True).shape == (2, 1)  # kwargs pass through
    hook.region_exit(capture, False)
    assert hook._mode is None
    hook.uninstall()


# ----------------------------------------------------------------------------------------------------------- base
def test_hook_error_lists_the_first_ten_failures_and_counts_all() -> None:
    from flashcheck.runtime.hooks import HookError

    err = HookError([("gpu_trace", ValueError(f"e{i}")) for i in range(11)])
    lines = str(err).splitlines()
    assert lines[0] == "11 detection hook error(s); the watched code was not fully checked:"
    assert lines[1:] == [f"  gpu_trace: ValueError: e{i}" for i in range(10)]
    assert len(err.errors) == 11


def test_an_uninstalled_hook_drops_late_events_and_raises_its_own_errors() -> None:
    hook, _, sink = gpu_trace()
    hook.uninstall()
    assert hook.installed is False
    hook._emit(Event("sync", "gpu_trace"))  # a callback torch still held fires late: dropped
    assert sink.events == []
    with pytest.raises(ValueError, match="late"):
        hook._error(ValueError("late"))
    hook.uninstall()  # idempotent
