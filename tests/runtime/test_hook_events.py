"""Each torch adapter driven directly with a recording sink: the exact events it emits for each API it watches (every
sync call, a single allocation, each copy kind), and none where it must stay quiet."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from flashcheck.runtime import Checker
from flashcheck.runtime.hooks import gpu_trace as gpu_trace_mod
from flashcheck.runtime.hooks.alloc_stats import AllocStatsHook, _torch_reader
from flashcheck.runtime.hooks.base import Hook
from flashcheck.runtime.hooks.gpu_trace import GpuTraceHook
from flashcheck.runtime.monitor import Event, Monitor, RegionRecord


class RecordingSink:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.errors: list[tuple[str, BaseException]] = []
        self.read = False
        self.hot = False
        self.open = False

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def hook_error(self, layer: str, exc: BaseException) -> None:
        self.errors.append((layer, exc))

    def reading(self) -> bool:
        return self.read

    def watching(self, thread: int) -> bool:
        return self.hot and not self.read

    def region_open(self) -> bool:
        return self.open

    @contextlib.contextmanager
    def implicit_region(self, name: str) -> Iterator[None]:
        yield


def records(n: int) -> list[RegionRecord]:
    mon = Monitor()
    return [mon.enter("replay") for _ in range(n)]


# ------------------------------------------------------------------------------------------------------ gpu_trace
class Registry:
    def __init__(self) -> None:
        self.callback_list: list[Any] = []

    def fire(self, *args: Any) -> None:
        for cb in list(self.callback_list):
            cb(*args)


def gpu_trace() -> tuple[GpuTraceHook, dict[str, Registry], RecordingSink]:
    regs = {k: Registry() for k in ("device_sync", "stream_sync", "event_sync", "alloc")}
    hook, sink = GpuTraceHook(registries=regs, activate=lambda: None, available=lambda: True), RecordingSink()
    hook.install(sink)
    return hook, regs, sink


def fire_all(regs: dict[str, Registry]) -> None:
    regs["device_sync"].fire()
    regs["stream_sync"].fire(7)
    regs["event_sync"].fire(3)
    regs["alloc"].fire(0x1000)


def test_gpu_trace_reports_each_sync_api_and_a_single_allocation() -> None:
    hook, regs, sink = gpu_trace()
    sink.hot = True
    fire_all(regs)
    sink.hot = False
    assert [(e.kind, e.layer, e.detail, e.count, e.thread) for e in sink.events] == [
        ("sync", "gpu_trace", "device synchronize (torch.cuda.synchronize)", 1, threading.get_ident()),
        ("sync", "gpu_trace", "stream synchronize", 1, threading.get_ident()),
        ("sync", "gpu_trace", "event synchronize", 1, threading.get_ident()),
        ("alloc", "gpu_trace", "caching-allocator allocation", 1, threading.get_ident()),
    ]
    assert all(any(fr.function == "fire_all" for fr in e.stack) for e in sink.events)
    hook.uninstall()
    assert all(r.callback_list == [] for r in regs.values())


def test_gpu_trace_reports_only_while_the_checker_says_hot_and_never_in_its_reads() -> None:
    hook, regs, sink = gpu_trace()
    fire_all(regs)  # installed, no hot region: nothing
    assert sink.events == []
    assert type(hook).region_enter is Hook.region_enter  # opening a region costs this layer nothing
    sink.hot = True
    regs["device_sync"].fire()
    assert [e.detail for e in sink.events] == ["device synchronize (torch.cuda.synchronize)"]
    sink.read = True
    fire_all(regs)  # the checker's own reads
    sink.hot, sink.read = False, False
    fire_all(regs)
    assert len(sink.events) == 1


def test_gpu_trace_asks_the_checker_which_regions_are_hot_on_the_calling_thread() -> None:
    regs = {k: Registry() for k in ("device_sync", "stream_sync", "event_sync", "alloc")}
    hook = GpuTraceHook(registries=regs, activate=lambda: None, available=lambda: True)
    with Checker(layers=[hook], device="cpu") as chk:
        regs["device_sync"].fire()  # no region
        with chk.region("capture"):
            regs["device_sync"].fire()  # a cold region
            with chk.region("replay", step=3):
                regs["stream_sync"].fire(7)
                other = threading.Thread(target=regs["event_sync"].fire, args=(1,))
                other.start()
                other.join()  # another thread: not this region's
        findings = chk.drain_findings()
    assert [(f.id, f.location.step, f.evidence["details"]) for f in findings] == [("FC201", 3, ["stream synchronize"])]


def test_gpu_trace_removes_exactly_its_callbacks_whatever_was_added_after_it() -> None:
    hook, regs, _ = gpu_trace()
    theirs = [lambda *a: None for _ in regs]
    for r, cb in zip(regs.values(), theirs, strict=True):
        r.callback_list.append(cb)
    hook.uninstall()
    assert [r.callback_list for r in regs.values()] == [[cb] for cb in theirs]


def test_gpu_trace_activates_torchs_trace_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch._C, "_activate_gpu_trace", lambda: calls.append(1))
    monkeypatch.setattr(gpu_trace_mod, "_ACTIVATED", [])
    gpu_trace_mod._activate()
    gpu_trace_mod._activate()
    assert calls == [1] and gpu_trace_mod._ACTIVATED == [True]


def test_gpu_trace_unavailable_without_a_device() -> None:
    assert GpuTraceHook(available=lambda: False).unavailable_reason() == "no CUDA device"
    assert GpuTraceHook(available=lambda: True).unavailable_reason() is None
    if not torch.cuda.is_available():
        assert GpuTraceHook().unavailable_reason() == "no CUDA device (gpu trace callbacks never fire)"


# ---------------------------------------------------------------------------------------------------- alloc_stats
class Allocator:
    def __init__(self) -> None:
        self.stats = [0, 0, 0]
        self.reads = 0

    def read(self) -> tuple[int, int, int]:
        self.reads += 1
        return self.stats[0], self.stats[1], self.stats[2]


def alloc_stats() -> tuple[AllocStatsHook, Allocator, RecordingSink]:
    a, sink = Allocator(), RecordingSink()
    hook = AllocStatsHook(read_stats=a.read, available=lambda: True)
    hook.install(sink)
    return hook, a, sink


def summary(sink: RecordingSink) -> list[tuple[Any, ...]]:
    return [(e.kind, e.layer, e.stack, e.detail, e.count, e.nbytes, e.region_id) for e in sink.events]


def test_alloc_stats_reports_a_single_allocation() -> None:
    hook, a, sink = alloc_stats()
    (rec,) = records(1)
    hook.region_enter(rec, True)
    a.stats[0] += 1
    hook.region_exit(rec, True)
    assert summary(sink) == [
        ("alloc", "alloc_stats", (), "1 allocation(s) counted by the caching allocator", 1, None, rec.id)
    ]


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        ((0, 1, 0), [("pool_growth", "1 new segment(s), 0 more bytes reserved", 0)]),
        ((0, 0, 4096), [("pool_growth", "0 new segment(s), 4,096 more bytes reserved", 4096)]),
        ((0, 0, -4096), []),  # memory released: not growth
        ((0, 2, -4096), [("pool_growth", "2 new segment(s), 0 more bytes reserved", 0)]),
        (
            (3, 1, 2048),
            [
                ("alloc", "3 allocation(s) counted by the caching allocator", None),
                ("pool_growth", "1 new segment(s), 2,048 more bytes reserved", 2048),
            ],
        ),
        ((0, 0, 0), []),
    ],
)
def test_alloc_stats_pool_growth(delta: tuple[int, int, int], expected: list[tuple[Any, ...]]) -> None:
    hook, a, sink = alloc_stats()
    (rec,) = records(1)
    hook.region_enter(rec, True)
    a.stats = [x + d for x, d in zip(a.stats, delta, strict=True)]
    hook.region_exit(rec, True)
    assert [(e.kind, e.detail, e.nbytes) for e in sink.events] == expected


def test_alloc_stats_measures_across_the_outermost_hot_region_less_the_checker_reads() -> None:
    hook, a, sink = alloc_stats()
    outer, inner, cold = records(3)
    hook.read_begin()  # no hot region open: nothing to subtract from
    hook.read_end()
    hook.region_enter(cold, False)
    hook.region_exit(cold, False)
    hook.region_exit(cold, True)  # closing more often than opened is ignored
    assert a.reads == 0
    hook.region_enter(outer, True)
    hook.region_enter(inner, True)
    a.stats[0] += 2
    hook.read_begin()
    a.stats = [a.stats[0] + 5, 1, 8192]  # the checker's own allocations
    hook.read_end()
    hook.region_exit(inner, True)
    hook.region_exit(inner, False)
    assert sink.events == []  # the outer region is still open
    a.stats[0] += 1
    hook.region_exit(outer, True)
    assert summary(sink) == [
        ("alloc", "alloc_stats", (), "3 allocation(s) counted by the caching allocator", 3, None, outer.id)
    ]
    hook.region_enter(outer, True)  # the next region starts afresh: nothing excluded, nothing carried over
    a.stats[0] += 1
    hook.region_exit(outer, True)
    assert sink.events[-1].count == 1 and len(sink.events) == 2


def test_alloc_stats_hands_a_failing_read_to_the_checker_and_recovers() -> None:
    hook, a, sink = alloc_stats()
    (rec,) = records(1)
    hook.region_enter(rec, True)
    hook._read = lambda: (_ for _ in ()).throw(RuntimeError("stats gone"))  # type: ignore[assignment]
    hook.region_exit(rec, True)
    assert [(layer, str(e)) for layer, e in sink.errors] == [("alloc_stats", "stats gone")]
    hook._read = a.read
    hook.region_enter(rec, True)
    a.stats[0] += 1
    hook.region_exit(rec, True)
    assert [e.count for e in sink.events] == [1]


def test_alloc_stats_reads_torchs_nested_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []

    def stats(dev: Any) -> dict[str, Any]:
        asked.append(dev)
        return {
            "allocation": {"all": {"allocated": 11}},
            "segment": {"all": {"allocated": 3}},
            "reserved_bytes": {"all": {"current": 4096}},
        }

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", stats)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert _torch_reader("cuda:1")() == (11, 3, 4096)
    assert _torch_reader(None)() == (11, 3, 4096)
    assert asked == [torch.device("cuda", 1), torch.device("cuda", 2)]
    hook = AllocStatsHook("cuda:1", available=lambda: True)
    hook.install(RecordingSink())
    assert hook._stats() == (11, 3, 4096) and asked[-1] == torch.device("cuda", 1)


def test_alloc_stats_unavailable_without_a_device() -> None:
    assert AllocStatsHook(available=lambda: False).unavailable_reason() == "no CUDA device"
    assert AllocStatsHook(available=lambda: True).unavailable_reason() is None
    if not torch.cuda.is_available():
        assert AllocStatsHook().unavailable_reason() == "no CUDA device (no caching-allocator statistics)"


def test_alloc_stats_pool_growth_event_in_full_and_one_byte_of_growth() -> None:
    hook, a, sink = alloc_stats()
    (rec,) = records(1)
    hook.region_enter(rec, True)
    a.stats[2] += 1
    hook.region_exit(rec, True)
    assert summary(sink) == [
        ("pool_growth", "alloc_stats", (), "0 new segment(s), 1 more bytes reserved", 1, 1, rec.id)
    ]


def test_alloc_stats_subtracts_every_read_of_a_region_and_tolerates_unpaired_ends() -> None:
    hook, a, sink = alloc_stats()
    (rec,) = records(1)
    hook.region_enter(rec, True)
    hook.read_end()  # an end without a begin: nothing to subtract
    for _ in range(2):
        hook.read_begin()
        a.stats[0] += 3
        hook.read_end()
    hook.read_end()
    a.stats[0] += 1
    hook.region_exit(rec, True)
    assert [e.count for e in sink.events] == [1]


def test_gpu_trace_calls_the_activation_it_was_given() -> None:
    calls: list[int] = []
    hook = GpuTraceHook(
        registries={k: Registry() for k in ("device_sync", "stream_sync", "event_sync", "alloc")},
        activate=lambda: calls.append(1),
        available=lambda: True,
    )
    hook.install(RecordingSink())
    hook.uninstall()
    assert calls == [1]
