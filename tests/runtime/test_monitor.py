"""The pure monitor on synthetic event streams: each rule must fire, and must stay quiet where it should."""

from __future__ import annotations

import threading

import pytest

from flashcheck.findings import Frame
from flashcheck.runtime import monitor as monitor_mod
from flashcheck.runtime.checks.allocation import ALLOCATION_IN_REPLAY
from flashcheck.runtime.checks.host_sync import HOST_SYNC_IN_REPLAY
from flashcheck.runtime.checks.pinned_copy import PINNED_COPY_CAPTURED
from flashcheck.runtime.monitor import Event, Monitor

SYNC_ID, ALLOC_ID, PINNED_ID = HOST_SYNC_IN_REPLAY.id, ALLOCATION_IN_REPLAY.id, PINNED_COPY_CAPTURED.id

USER = Frame("/srv/engine/runner.py", 42, "prepare", "seq = lens.tolist()")
OTHER_USER = Frame("/srv/engine/runner.py", 57, "prepare", "n = int(x)")
INTERNAL = Frame(monitor_mod.__file__, 100, "observe")  # a flashcheck frame: never the user line
STACK = (Frame("/srv/engine/main.py", 3, "<module>"), USER)
STACK2 = (Frame("/srv/engine/main.py", 3, "<module>"), OTHER_USER)


def run(mon: Monitor, region: str, *events: Event, step: int | None = 0) -> None:
    rec = mon.enter(region, step=step)  # type: ignore[arg-type]
    for e in events:
        mon.observe(e)
    mon.exit(rec)


@pytest.mark.parametrize("region", ["replay", "prepare_replay"])
def test_sync_in_hot_region_fires_with_user_location(region: str) -> None:
    mon = Monitor()
    run(mon, region, Event("d2h_copy", "dispatch", STACK, "aten._to_copy", memory="pageable"), step=7)
    (f,) = mon.drain()
    assert f.id == SYNC_ID and f.name == "host-sync-in-replay"
    assert (f.location.file, f.location.line, f.location.step, f.location.region) == (USER.file, 42, 7, region)
    assert f.stack == STACK and f.evidence["layers"] == ["dispatch"]
    assert "device-to-host copy" in f.message and "aten._to_copy" in f.message


@pytest.mark.parametrize("region", ["plan", "run"])
def test_sync_on_the_eager_per_step_path_fires(region: str) -> None:
    mon = Monitor()
    run(mon, region, Event("sync", "gpu_trace", STACK, "stream_synchronize"), step=2)
    (f,) = mon.drain()
    assert f.id == SYNC_ID and f.location.region == region and f.location.step == 2


@pytest.mark.parametrize("region", ["setup", "capture"])
def test_sync_outside_hot_regions_is_quiet(region: str) -> None:
    mon = Monitor()
    run(mon, region, Event("sync", "gpu_trace", STACK, "stream_synchronize"))
    assert mon.drain() == []


def test_a_region_the_target_declares_cold_is_quiet() -> None:
    mon = Monitor(cold_regions=("plan",))
    run(mon, "plan", Event("sync", "sync_debug", STACK))
    assert mon.drain() == []
    run(mon, "run", Event("sync", "sync_debug", STACK))
    (f,) = mon.drain()
    assert f.id == SYNC_ID and f.location.region == "run"


def test_plan_nested_in_prepare_replay_is_hot() -> None:
    mon = Monitor()
    outer = mon.enter("prepare_replay", step=1)
    inner = mon.enter("plan", step=1)
    mon.observe(Event("sync", "cupti", (), "cudaStreamSynchronize"))
    mon.exit(inner)
    mon.exit(outer)
    (f,) = mon.drain()
    assert f.location.region == "prepare_replay" and f.evidence["regions"] == ["prepare_replay", "plan"]


def test_same_event_seen_by_several_layers_is_one_finding() -> None:
    mon = Monitor()
    inner = (*STACK, INTERNAL)  # a layer that captured its own frames too: the user line is still the key
    run(
        mon,
        "replay",
        Event("sync", "sync_debug", inner, "called a synchronizing CUDA operation"),
        Event("d2h_copy", "dispatch", STACK, "aten._local_scalar_dense"),
        Event("sync", "gpu_trace", inner, "stream_synchronize"),
        Event("sync", "cupti", (), "cudaStreamSynchronize"),
        Event("d2h_copy", "cupti", (), "Memcpy DtoH (Device -> Pageable)"),
    )
    (f,) = mon.drain()
    assert f.evidence["layers"] == ["cupti", "dispatch", "gpu_trace", "sync_debug"]
    assert f.location.line == 42 and f.evidence["count"] == 2  # cupti saw two occurrences of its own


def test_different_lines_are_different_findings_and_loops_count() -> None:
    mon = Monitor()
    evs = [Event("d2h_copy", "dispatch", STACK)] * 3 + [Event("d2h_copy", "dispatch", STACK2)]
    run(mon, "replay", *evs)
    a, b = mon.drain()
    assert (a.location.line, a.evidence["count"]) == (42, 3)
    assert (b.location.line, b.evidence["count"]) == (57, 1)


def test_checker_read_never_counts() -> None:
    mon = Monitor()
    rec = mon.enter("replay", step=0)
    mon.begin_read()
    mon.observe(Event("d2h_copy", "dispatch", STACK, thread=threading.get_ident()))
    mon.end_read()
    mon.exit(rec)
    assert mon.drain() == []
    with pytest.raises(RuntimeError, match="more often"):
        mon.end_read()


def test_events_outside_regions_and_from_other_threads_are_ignored() -> None:
    mon = Monitor()
    mon.observe(Event("sync", "gpu_trace", STACK))
    rec = mon.enter("replay")
    mon.observe(Event("sync", "gpu_trace", STACK, thread=threading.get_ident() + 1))
    mon.exit(rec)
    assert mon.drain() == [] and mon.ignored == 2


def test_pageable_h2d_in_replay_fires_pinned_h2d_is_quiet() -> None:
    mon = Monitor()
    run(mon, "prepare_replay", Event("h2d_copy", "dispatch", STACK, memory="pinned"))
    assert mon.drain() == []
    run(mon, "prepare_replay", Event("h2d_copy", "dispatch", STACK, memory="pageable"))
    (f,) = mon.drain()
    assert f.id == SYNC_ID and "pageable" in f.message


def test_allocation_and_pool_growth_in_replay() -> None:
    mon = Monitor()
    run(mon, "replay", Event("alloc", "gpu_trace", STACK), Event("free", "gpu_trace", STACK))
    run(mon, "replay", Event("pool_growth", "alloc_stats", (), nbytes=2 << 20), step=1)
    a, b = mon.drain()
    assert a.id == ALLOC_ID and a.location.line == 42
    assert b.id == ALLOC_ID and b.evidence["nbytes"] == 2 << 20 and "no Python stack" in b.message


def test_allocation_outside_hot_regions_is_quiet() -> None:
    mon = Monitor()
    run(mon, "capture", Event("alloc", "gpu_trace", STACK))
    run(mon, "run", Event("alloc", "gpu_trace", STACK), Event("pool_growth", "alloc_stats"))
    assert mon.drain() == []


def test_stackless_event_merges_into_finding_with_stack() -> None:
    mon = Monitor()
    run(mon, "replay", Event("alloc", "alloc_stats", (), count=1), Event("alloc", "gpu_trace", STACK))
    (f,) = mon.drain()
    assert f.evidence["layers"] == ["alloc_stats", "gpu_trace"] and f.location.line == 42


def test_pinned_copy_in_capture_fires_pageable_or_device_is_quiet() -> None:
    mon = Monitor()
    run(mon, "capture", Event("h2d_copy", "dispatch", STACK, memory="pinned"))
    run(mon, "capture", Event("d2h_copy", "dispatch", STACK2, memory="pinned"))
    a, b = mon.drain()
    assert a.id == b.id == PINNED_ID and a.location.region == "capture"
    assert "host-to-device" in a.message and "device-to-host" in b.message
    run(mon, "capture", Event("h2d_copy", "dispatch", STACK, memory="pageable"))
    run(mon, "run", Event("h2d_copy", "dispatch", STACK, memory="pinned"))
    assert mon.drain() == []


def test_graph_executed_pinned_copy_in_replay_is_fc203_not_fc201() -> None:
    mon = Monitor()
    run(mon, "replay", Event("d2h_copy", "cupti", (), "Memcpy DtoH (Device -> Pinned)", "pinned", in_graph=True))
    (f,) = mon.drain()
    assert f.id == PINNED_ID


def test_deferred_event_attributed_to_closed_region_by_id() -> None:
    mon = Monitor(record_region_stacks=True)
    rec = mon.enter("replay", step=4, stack=STACK)
    mon.exit(rec)
    mon.observe(Event("sync", "cupti", (), "cudaDeviceSynchronize", region_id=rec.id))
    (f,) = mon.drain()
    assert f.location.step == 4 and f.location.line == 42  # where the region was opened
    mon.observe(Event("sync", "cupti", (), region_id=rec.id))  # region forgotten after the drain
    assert mon.drain() == []


def test_regions_must_close_in_order() -> None:
    mon = Monitor()
    a = mon.enter("prepare_replay")
    mon.enter("plan")
    with pytest.raises(RuntimeError, match="out of order"):
        mon.exit(a)


def test_findings_round_trip_to_json() -> None:
    mon = Monitor()
    run(mon, "replay", Event("sync", "sync_debug", STACK, "x"))
    (f,) = mon.drain()
    assert type(f).from_dict(f.to_dict()) == f


def test_pinned_copy_in_capture_region_but_not_in_stream_capture_is_quiet() -> None:
    """A target's plan and warm-up run eagerly inside its capture region: only copies issued while the stream is
    capturing become graph nodes (on an H100, FlashInfer's plan makes pinned H2D copies there)."""
    mon = Monitor()
    run(mon, "capture", Event("h2d_copy", "dispatch", STACK, memory="pinned", capturing=False))
    run(mon, "capture", Event("h2d_copy", "cupti", (), memory="pinned", capturing=False))
    assert mon.drain() == []
    run(mon, "capture", Event("h2d_copy", "dispatch", STACK, memory="pinned", capturing=True))
    (f,) = mon.drain()
    assert f.id == PINNED_ID


# ---- the finding's text and evidence, pinned ----------------------------------------------------------------------
def test_the_finding_message_location_and_evidence_in_full() -> None:
    mon = Monitor()
    outer = mon.enter("prepare_replay", step=4, step_name="replay bs=8")
    inner = mon.enter("plan", step=4, step_name="replay bs=8")
    for detail, nbytes in (("aten._to_copy", 100), ("Memcpy DtoH (Device -> Pageable)", 50), ("aten._to_copy", None)):
        mon.observe(Event("d2h_copy", "dispatch", STACK, detail, nbytes=nbytes))
    mon.exit(inner)
    mon.exit(outer)
    (f,) = mon.drain()
    assert f.message == (
        "device-to-host copy x3 inside `prepare_replay` (inside `plan`) at step 4: aten._to_copy, "
        "Memcpy DtoH (Device -> Pageable) (seen by dispatch)"
    )
    assert (f.location.step, f.location.step_name, f.location.region, f.location.function) == (
        4,
        "replay bs=8",
        "prepare_replay",
        "prepare",
    )
    assert f.evidence == {
        "check": SYNC_ID,
        "region": "plan",
        "regions": ["prepare_replay", "plan"],
        "layers": ["dispatch"],
        "details": ["aten._to_copy", "Memcpy DtoH (Device -> Pageable)"],
        "count": 3,
        "nbytes": 150,
        "code": "seq = lens.tolist()",
    }
    assert f.hint.startswith("keep host mirrors") and f.kind == "runtime"


@pytest.mark.parametrize(("n", "times"), [(1, ""), (2, " x2")])
def test_the_count_shows_from_two_occurrences(n: int, times: str) -> None:
    mon = Monitor()
    run(mon, "replay", *[Event("sync", "gpu_trace", STACK)] * n, step=None)
    (f,) = mon.drain()
    assert f.message == f"host synchronization{times} inside `replay`: no detail (seen by gpu_trace)"
    assert f.evidence["count"] == n and "nbytes" not in f.evidence


def test_details_keep_the_first_eight_distinct_non_empty_ones() -> None:
    mon = Monitor()
    events = [Event("sync", "gpu_trace", STACK, f"d{i}") for i in range(10)]
    run(mon, "replay", Event("sync", "gpu_trace", STACK, ""), *events)
    (f,) = mon.drain()
    assert f.evidence["details"] == [f"d{i}" for i in range(8)] and f.evidence["count"] == 11


def test_a_stackless_event_alone_is_located_where_its_region_was_opened() -> None:
    mon = Monitor(record_region_stacks=True)
    rec = mon.enter("replay", step=1, stack=STACK2)
    mon.observe(Event("pool_growth", "alloc_stats", detail="1 segment"))
    mon.exit(rec)
    (f,) = mon.drain()
    assert (f.id, f.name) == (ALLOC_ID, "allocation-in-replay")
    assert f.message == (
        "caching-allocator pool growth (new device memory reserved) inside `replay` at step 1: 1 segment (seen by "
        "alloc_stats); no Python stack: only layers without one saw it, the location is where the region was opened"
    )
    assert (f.location.file, f.location.line) == (OTHER_USER.file, OTHER_USER.line)


def test_region_stacks_are_kept_only_when_asked() -> None:
    assert Monitor().enter("replay", stack=STACK).stack == ()
    assert Monitor(record_region_stacks=True).enter("replay", stack=STACK).stack == STACK


def test_pinned_copy_executed_by_a_graph_names_the_outermost_hot_region() -> None:
    mon = Monitor()
    outer = mon.enter("replay", step=2)
    inner = mon.enter("plan", step=2)
    mon.observe(Event("h2d_copy", "cupti", STACK, "Memcpy HtoD (Pinned -> Device)", memory="pinned", in_graph=True))
    mon.exit(inner)
    mon.exit(outer)
    (f,) = mon.drain()
    assert f.id == PINNED_ID and f.location.region == "replay"
    assert f.message.startswith(
        "host-to-device copy of pinned host memory captured into a CUDA graph inside `replay` (inside `plan`)"
    )


def test_regions_are_numbered_from_one_and_found_by_id_until_drained() -> None:
    mon = Monitor()
    a = mon.enter("setup", step_name="s", thread=7)
    b = mon.enter("plan")
    assert (a.id, b.id, a.step_name, a.thread, b.enclosing) == (1, 2, "s", 7, ("setup",))
    assert mon.region(2) is b and mon.region(3) is None
    mon.exit(b)
    assert b.closed is True and a.closed is False and mon.open_regions == (a,)
    with pytest.raises(RuntimeError, match=r"region 'plan' \(id 2\) closed out of order; open regions: setup$"):
        mon.exit(b)
    mon.drain()
    assert mon.region(2) is None and mon.region(1) is a  # closed regions are forgotten, open ones kept
    mon.exit(a)
    with pytest.raises(RuntimeError, match=r"open regions: none$"):
        mon.exit(a)


def test_events_outside_regions_and_in_reads_are_counted_as_ignored() -> None:
    mon = Monitor()
    mon.observe(Event("sync", "gpu_trace", STACK))
    mon.observe(Event("sync", "gpu_trace", STACK, region_id=99))  # a region the monitor does not know
    rec = mon.enter("replay", thread=5)
    mon.begin_read(thread=5)
    mon.observe(Event("sync", "gpu_trace", STACK, thread=5))
    mon.end_read(thread=5)
    mon.observe(Event("sync", "gpu_trace", STACK, thread=6))  # another thread: no region of its own
    mon.exit(rec)
    assert mon.ignored == 4 and mon.drain() == []


def test_reads_nest_per_thread() -> None:
    mon = Monitor()
    mon.begin_read(thread=5)
    mon.begin_read(thread=5)
    assert mon.reading(5) and not mon.reading() and not mon.reading(6)
    mon.end_read(thread=5)
    assert mon.reading(5)
    mon.end_read(thread=5)
    assert not mon.reading(5) and mon._reading == {}
    with pytest.raises(RuntimeError, match="closed more often than opened"):
        mon.end_read(thread=5)
    mon.begin_read()
    assert mon.reading() and mon.reading(threading.get_ident()) and not mon.reading(5)


def test_watching_is_hot_and_not_reading_on_the_named_thread() -> None:
    mon = Monitor()
    me, other = threading.get_ident(), threading.get_ident() + 1
    assert not mon.watching(me)  # no region open
    mon.enter("capture")  # cold
    assert not mon.watching(me)
    mon.enter("replay", thread=other)  # hot, on another thread only
    assert mon.watching(other) and not mon.watching(me)
    mon.enter("plan")  # hot on this thread
    assert mon.watching(me)
    mon.begin_read()  # the checker's own read on this thread: events do not count here ...
    assert not mon.watching(me) and mon.watching(other)  # ... nor is another thread's region affected
    mon.end_read()
    assert mon.watching(me)
