"""The CUPTI layer on CPU: its attribution of activity records to regions, its callbacks on blocking calls through
the checker (a fake backend plays CUPTI), and the cupti-python binding's conversion of records (a fake module)."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flashcheck.findings import Finding
from flashcheck.runtime import Checker
from flashcheck.runtime.hooks import cupti as cupti_mod
from flashcheck.runtime.hooks.cupti import (
    AllocRecord,
    ApiRecord,
    CopyRecord,
    CuptiBindings,
    CuptiHook,
    Records,
    Window,
    api_base_name,
    attribute,
    recorded_api,
)

T = threading.get_ident() & 0xFFFFFFFF


def here() -> int:
    return sys._getframe(1).f_lineno


def recs(apis: list[ApiRecord] | None = None, copies: list[CopyRecord] | None = None, allocs: Any = None) -> Records:
    return Records(apis or [], copies or [], allocs or [])


# ------------------------------------------------------------------------------------------------------ names
@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("cuMemcpyDtoH_v2", "cuMemcpyDtoH"),
        ("cudaStreamSynchronize_ptsz_v7000", "cudaStreamSynchronize"),
        ("cudaMemcpy_v3020", "cudaMemcpy"),
        ("cuCtxSynchronize_v2", "cuCtxSynchronize"),
        ("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyHtoDAsync"),
        ("cudaGraphLaunch", "cudaGraphLaunch"),
        ("cuMemcpy2DUnaligned_v2", "cuMemcpy2DUnaligned"),
    ],
)
def test_api_base_names_drop_version_and_stream_suffixes(name: str, base: str) -> None:
    assert api_base_name(name) == base


@pytest.mark.parametrize(
    ("name", "recorded"),
    [
        ("cudaMemcpyAsync", True),
        ("cuMemcpyDtoHAsync", True),
        ("cudaMemcpy", True),
        ("cudaGraphLaunch", True),
        ("cuGraphLaunch", True),
        ("cudaMalloc", True),
        ("cuMemCreate", True),
        ("cudaLaunchKernel", False),
        ("cudaStreamSynchronize", False),  # reported by its callback, with a stack
        ("cudaMallocHost", False),  # pinned host memory, not a device allocation
        ("cudaMemsetAsync", False),
    ],
)
def test_only_copy_launch_and_allocation_calls_are_recorded(name: str, recorded: bool) -> None:
    assert recorded_api(name) is recorded


# ------------------------------------------------------------------------------------------------ attribution
def test_a_copy_counts_in_the_innermost_region_open_where_its_call_ran() -> None:
    regions = [Window(1, T, 100, 200), Window(2, T, 120, 180), Window(3, T, 300, 400)]
    apis = [
        ApiRecord("cudaMemcpyAsync", 130, 131, T, 11),  # inside 2, inside 1: the innermost
        ApiRecord("cudaMemcpyAsync", 190, 191, T, 12),  # after 2 closed, still in 1
        ApiRecord("cudaMemcpyAsync", 180, 181, T, 13),  # at 2's last timestamp: still in 2
        ApiRecord("cudaGraphLaunch", 350, 351, T, 14),
        ApiRecord("cudaMemcpyAsync", 250, 251, T, 15),  # between regions
    ]
    copies = [
        CopyRecord("HtoD", "pageable", "device", 11, False, 8),
        CopyRecord("DtoH", "device", "pinned", 12, False, 4),
        CopyRecord("DtoH", "device", "pageable", 13, False, 4),
        CopyRecord("HtoD", "pinned", "device", 14, True, 64),  # executed by the graph the launch replayed
        CopyRecord("DtoH", "device", "pageable", 15, False, 4),
    ]
    evs = attribute(regions, [], recs(apis, copies))
    assert [(e.kind, e.memory, e.region_id, e.in_graph, e.nbytes) for e in evs] == [  # in the order of the calls
        ("h2d_copy", "pageable", 2, False, 8),
        ("d2h_copy", "pageable", 2, False, 4),
        ("d2h_copy", "pinned", 1, False, 4),
        ("h2d_copy", "pinned", 3, True, 64),
    ]
    assert [e.detail for e in evs] == [
        "Memcpy HtoD (Pageable -> Device) by cudaMemcpyAsync",
        "Memcpy DtoH (Device -> Pageable) by cudaMemcpyAsync",
        "Memcpy DtoH (Device -> Pinned) by cudaMemcpyAsync",
        "Memcpy HtoD (Pinned -> Device) by cudaGraphLaunch",
    ]
    assert all(e.layer == "cupti" and e.stack == () and e.capturing is False and e.thread is None for e in evs)


def test_a_graph_launch_makes_its_copies_graph_copies_even_without_the_graph_flag() -> None:
    (ev,) = attribute(
        [Window(1, T, 0, 10)],
        [],
        recs([ApiRecord("cuGraphLaunch", 5, 6, T, 7)], [CopyRecord("HtoD", "pinned", "device", 7, False, 4)]),
    )
    assert ev.in_graph is True


def test_other_threads_reads_unknown_launches_and_other_copy_kinds_are_dropped() -> None:
    other = T ^ 1
    regions = [Window(1, T, 0, 100), Window(9, other, 0, 100)]
    reads = [Window(None, T, 20, 30)]
    apis = [
        ApiRecord("cudaMemcpyAsync", 25, 26, T, 1),  # inside the checker's own read
        ApiRecord("cudaMemcpyAsync", 30, 31, T, 2),  # at the read's last timestamp: still the read
        ApiRecord("cudaMemcpyAsync", 50, 51, other ^ 2, 3),  # a thread with no region open
        ApiRecord("cudaMemcpyAsync", 60, 61, T, 4),
        ApiRecord("cudaMemcpyAsync", 70, 71, T, 0),  # no correlation: no launch
        ApiRecord("cudaMemcpyAsync", 65, 66, other, 6),  # the other thread's own region
    ]
    copies = [
        CopyRecord("DtoH", "device", "pageable", 1, False, 4),
        CopyRecord("DtoH", "device", "pageable", 2, False, 4),
        CopyRecord("DtoH", "device", "pageable", 3, False, 4),
        CopyRecord("DtoD", "device", "device", 4, False, 4),
        CopyRecord("HtoH", "pageable", "pageable", 4, False, 4),
        CopyRecord("DtoH", "device", "pageable", 0, False, 4),
        CopyRecord("DtoH", "device", "other", 99, False, 4),  # its call was not recorded
        CopyRecord("HtoD", "other", "device", 4, False, 4),  # managed or unknown host memory
        CopyRecord("DtoH", "device", "pinned", 6, False, 4),
    ]
    evs = attribute(regions, reads, recs(apis, copies))
    assert [(e.kind, e.memory, e.region_id) for e in evs] == [("h2d_copy", "unknown", 1), ("d2h_copy", "pinned", 9)]


def test_device_allocations_count_where_their_call_ran() -> None:
    apis = [ApiRecord("cudaMalloc", 5, 6, T, 1), ApiRecord("cuMemAlloc", 50, 51, T, 2)]
    allocs = [AllocRecord(2 << 20, 1), AllocRecord(4096, 2), AllocRecord(8, 3)]
    (ev,) = attribute([Window(4, T, 0, 10)], [], recs(apis, allocs=allocs))
    assert (ev.kind, ev.layer, ev.detail, ev.nbytes, ev.region_id) == (
        "alloc",
        "cupti",
        "cudaMalloc of 2,097,152 bytes",
        2 << 20,
        4,
    )


def test_nothing_in_nothing_out() -> None:
    assert attribute([], [], recs([ApiRecord("cudaMemcpyAsync", 1, 2, T, 1)])) == []
    assert attribute([Window(1, T, 0, 5)], [], recs()) == []


# ----------------------------------------------------------------------------------------- the hook, with fakes
class FakeBackend:
    """Plays CUPTI: a clock, the blocking-call callback, and the records each flush returns."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.t = 0
        self.on_sync: Callable[[str, int], None] | None = None
        self.queued = recs()
        self.calls: list[str] = []

    def open(self) -> str | None:
        self.calls.append("open")
        return self.refuse

    def start(self, on_sync: Callable[[str, int], None]) -> None:
        self.calls.append("start")
        self.on_sync = on_sync

    def timestamp(self) -> int:
        self.t += 10
        return self.t

    def flush(self) -> Records:
        self.calls.append("flush")
        out, self.queued = self.queued, recs()
        return out

    def close(self) -> Records:
        self.calls.append("close")
        self.on_sync = None
        return self.flush()

    # what the watched code does
    def call(self, name: str, corr: int, *, copy: CopyRecord | None = None, alloc: int | None = None) -> None:
        self.t += 1
        self.queued.apis.append(ApiRecord(name, self.t, self.t + 1, T, corr))
        if copy is not None:
            self.queued.copies.append(copy)
        if alloc is not None:
            self.queued.allocs.append(AllocRecord(alloc, corr))

    def sync(self, name: str, corr: int) -> None:
        assert self.on_sync is not None, "the hook registered no callback"
        self.on_sync(name, corr)


@pytest.fixture
def fake() -> Iterator[tuple[FakeBackend, CuptiHook]]:
    backend = FakeBackend()
    yield backend, CuptiHook(backend=backend, available=lambda: True)


def only(findings: list[Finding], check: str) -> Finding:
    assert [f.id for f in findings] == [check], "\n".join(str(f) for f in findings)
    return findings[0]


def test_a_blocking_call_in_a_hot_region_is_reported_at_the_users_line(fake: tuple[FakeBackend, CuptiHook]) -> None:
    backend, hook = fake
    with Checker(layers=[hook]) as chk:
        assert chk.active_layers == ["cupti"] and backend.calls == ["open", "start"]
        with chk.region("replay", step=7):
            line = here() + 1
            backend.sync("cudaStreamSynchronize", 5)
            backend.sync("cuStreamSynchronize", 5)  # the driver call inside it: the same correlation, once
        f = only(chk.drain_findings(), "FC201")
    assert (f.location.file, f.location.line, f.location.step) == (__file__, line, 7)
    assert f.evidence["layers"] == ["cupti"] and f.evidence["details"] == ["cudaStreamSynchronize"]
    assert f.evidence["count"] == 1
    assert backend.calls[-2:] == ["close", "flush"] and backend.on_sync is None


def test_blocking_calls_outside_hot_regions_or_in_reads_are_quiet(fake: tuple[FakeBackend, CuptiHook]) -> None:
    backend, hook = fake
    with Checker(layers=[hook]) as chk:
        backend.sync("cudaDeviceSynchronize", 1)  # no region
        with chk.region("capture"):
            backend.sync("cudaDeviceSynchronize", 2)  # not a per-step region
        with chk.region("replay", step=0), chk.checker_read():
            backend.sync("cudaStreamSynchronize", 3)
        assert chk.drain_findings() == []
        with chk.region("replay", step=1):
            for corr in (4, 6):  # two calls on one line: one finding, counted twice
                backend.sync("cudaStreamSynchronize", corr)
        assert only(chk.drain_findings(), "FC201").evidence["count"] == 2


def test_copies_and_allocations_are_attributed_at_the_drain(fake: tuple[FakeBackend, CuptiHook]) -> None:
    backend, hook = fake
    with Checker(layers=[hook]) as chk:
        line = here() + 1
        with chk.region("prepare_replay", step=3):
            backend.call("cudaMemcpyAsync", 1, copy=CopyRecord("HtoD", "pageable", "device", 1, False, 8))
            backend.call("cudaMemcpyAsync", 2, copy=CopyRecord("HtoD", "pinned", "device", 2, False, 8))  # fine
        with chk.region("replay", step=3):
            backend.call("cudaMalloc", 3, alloc=1 << 21)
            backend.call("cudaGraphLaunch", 4, copy=CopyRecord("HtoD", "pinned", "device", 4, True, 8))
        with chk.checker_read():
            backend.call("cudaMemcpyAsync", 5, copy=CopyRecord("DtoH", "device", "pageable", 5, False, 4))
        findings = chk.drain_findings()
    assert [(f.id, f.location.region, f.location.step) for f in findings] == [
        ("FC201", "prepare_replay", 3),
        ("FC202", "replay", 3),
        ("FC203", "replay", 3),
    ]
    fc201 = findings[0]
    assert "Pageable -> Device" in fc201.message and "no Python stack" in fc201.message
    assert (fc201.location.file, fc201.location.line) == (__file__, line)  # where the region was opened
    assert findings[1].evidence["nbytes"] == 1 << 21


def test_records_wait_while_a_region_is_open_and_the_rest_comes_at_uninstall(
    fake: tuple[FakeBackend, CuptiHook],
) -> None:
    backend, hook = fake
    with Checker(layers=[hook]) as chk:
        with chk.region("replay", step=0):
            backend.call("cudaMemcpyAsync", 1, copy=CopyRecord("DtoH", "device", "pinned", 1, False, 4))
            assert hook.collect() == [] and "flush" not in backend.calls  # the region's end is not known yet
        with chk.region("replay", step=1):
            backend.call("cudaMemcpyAsync", 2, copy=CopyRecord("DtoH", "device", "pinned", 2, False, 4))
    assert backend.calls == ["open", "start", "flush", "close", "flush"]  # read as the checker closes, not before
    assert [f.location.step for f in chk.drain_findings()] == [0, 1]


def test_unavailable_without_a_device_or_when_cupti_refuses() -> None:
    assert CuptiHook(available=lambda: False).unavailable_reason() == "no CUDA device"
    refused = FakeBackend(refuse="CUPTI is held by another client")
    with Checker(layers=[CuptiHook(backend=refused, available=lambda: True)]) as chk:
        assert chk.active_layers == [] and chk.skipped_layers == {"cupti": "CUPTI is held by another client"}
    assert refused.calls == ["open"]
    import torch

    if not torch.cuda.is_available():
        assert CuptiHook().unavailable_reason() == "no CUDA device (CUPTI needs one)"


def test_a_hook_installed_without_asking_opens_cupti_itself_or_says_why_not() -> None:
    from tests.runtime.test_hook_events import RecordingSink

    ok = FakeBackend()
    hook = CuptiHook(backend=ok, available=lambda: True)
    hook.install(RecordingSink())
    hook.uninstall()
    assert ok.calls == ["open", "start", "close", "flush"]
    with pytest.raises(RuntimeError, match="CUPTI layer: busy"):
        CuptiHook(backend=FakeBackend(refuse="busy"), available=lambda: True).install(RecordingSink())


def test_an_error_in_the_callback_is_a_hook_error(
    fake: tuple[FakeBackend, CuptiHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashcheck.runtime.hooks import HookError

    backend, hook = fake

    def broken(skip: int) -> tuple[()]:
        raise LookupError("no frames")

    monkeypatch.setattr(cupti_mod, "capture_stack", broken)
    with pytest.raises(HookError, match="cupti: LookupError: no frames"), Checker(layers=[hook]) as chk:
        with chk.region("replay"):
            backend.sync("cudaDeviceSynchronize", 1)  # CUPTI would only print the error: the checker raises it
        chk.drain_findings()


# ------------------------------------------------------------------------------------ the cupti-python binding
class FakeCupti(types.SimpleNamespace):
    """The parts of ``cupti.cupti`` the binding uses, recording what it was asked."""

    def __init__(self, *, subscribe_error: Exception | None = None) -> None:
        kinds = types.SimpleNamespace(MEMCPY=1, MEMORY2=2, RUNTIME=3, DRIVER=4)
        domains = types.SimpleNamespace(RUNTIME_API=2, DRIVER_API=1)
        super().__init__(ActivityKind=kinds, CallbackDomain=domains)
        self.names = {
            (2, 1): "cudaStreamSynchronize_v3020",
            (2, 2): "cudaMemcpyAsync_v3020",
            (2, 3): "cudaLaunchKernel_v7000",
            (1, 1): "cuStreamSynchronize",
            (1, 2): "cuMemAlloc_v2",
        }
        self.subscribe_error = subscribe_error
        self.enabled_callbacks: list[tuple[int, int]] = []
        self.api_records: dict[tuple[str, int], int] = {}
        self.activities: list[int] = []
        self.flushes = 0
        self.unsubscribed: list[int] = []
        self.callback: Any = None
        self.buffers: Any = None
        self.pending: list[Any] = []

    def subscribe(self, callback: Any, userdata: Any) -> int:
        if self.subscribe_error is not None:
            raise self.subscribe_error
        self.callback = callback
        return 42

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return self.names[(int(domain), cbid)]

    def enable_callback(self, on: int, sub: int, domain: int, cbid: int) -> None:
        assert on == 1 and sub == 42
        self.enabled_callbacks.append((domain, cbid))

    def activity_register_callbacks(self, requested: Any, completed: Any) -> None:
        self.buffers = (requested, completed)

    def activity_enable(self, kind: int) -> None:
        self.activities.append(kind)

    def activity_disable(self, kind: int) -> None:
        self.activities.remove(kind)

    def activity_enable_runtime_api(self, cbid: int, on: int) -> None:
        self.api_records[("runtime", cbid)] = on

    def activity_enable_driver_api(self, cbid: int, on: int) -> None:
        self.api_records[("driver", cbid)] = on

    def get_timestamp(self) -> int:
        return 123

    def activity_flush_all(self, flag: int) -> None:
        assert flag == 1
        self.flushes += 1
        acts, self.pending = self.pending, []
        self.buffers[1](acts)

    def unsubscribe(self, sub: int) -> None:
        self.unsubscribed.append(sub)


def act(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


@pytest.fixture
def fake_cupti(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCupti]:
    mod = FakeCupti()
    pkg = types.ModuleType("cupti")
    pkg.cupti = mod  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", pkg)
    yield mod
    assert cupti_mod._CLAIMED == []


def test_the_binding_subscribes_records_converts_and_gives_everything_back(fake_cupti: FakeCupti) -> None:
    b = CuptiBindings()
    assert b.open() is None
    assert CuptiBindings().open() == (
        "another checker's CUPTI layer is active in this process (CUPTI has one subscriber per process)"
    )
    seen: list[tuple[str, int]] = []
    b.start(lambda name, corr: seen.append((name, corr)))
    assert sorted(fake_cupti.enabled_callbacks) == [(1, 1), (2, 1)]  # the blocking calls only
    assert fake_cupti.activities == [1, 2, 3, 4]
    assert fake_cupti.api_records == {("runtime", 1): 0, ("runtime", 2): 1, ("runtime", 3): 0, ("driver", 1): 0,
                                      ("driver", 2): 1}  # fmt: skip
    assert b.timestamp() == 123
    cb = fake_cupti.callback
    cb(None, 2, 1, act(callback_site=0, correlation_id=9, function_name="cudaStreamSynchronize"))
    cb(None, 2, 1, act(callback_site=1, correlation_id=9, function_name="cudaStreamSynchronize"))  # exit: ignored
    cb(None, 1, 77, act(callback_site=0, correlation_id=10, function_name="cuSomethingNew"))
    assert seen == [("cudaStreamSynchronize", 9), ("cuSomethingNew", 10)]
    assert fake_cupti.buffers[0]() == (8 << 20, 0)
    tid = (1 << 40) + 5
    fake_cupti.pending = [
        act(kind=3, cbid=2, start=10, end=11, thread_id=tid, correlation_id=9),
        act(kind=4, cbid=2, start=12, end=13, thread_id=6, correlation_id=10),
        act(kind=1, copy_kind=2, src_kind=3, dst_kind=1, correlation_id=9, graph_id=0, bytes=4),
        act(kind=1, copy_kind=1, src_kind=2, dst_kind=3, correlation_id=9, graph_id=5, bytes=8),
        act(kind=1, copy_kind=7, src_kind=3, dst_kind=4, correlation_id=9, graph_id=0, bytes=8),
        act(kind=2, memory_operation_type=1, memory_kind=3, bytes=4096, correlation_id=10),
        act(kind=2, memory_operation_type=2, memory_kind=3, bytes=4096, correlation_id=10),  # a release
        act(kind=2, memory_operation_type=1, memory_kind=2, bytes=64, correlation_id=10),  # pinned host memory
        act(kind=99),
    ]
    got = b.flush()
    assert got.apis == [ApiRecord("cudaMemcpyAsync", 10, 11, 5, 9), ApiRecord("cuMemAlloc", 12, 13, 6, 10)]
    assert got.copies == [
        CopyRecord("DtoH", "device", "pageable", 9, False, 4),
        CopyRecord("HtoD", "pinned", "device", 9, True, 8),
        CopyRecord("other", "device", "other", 9, False, 8),
    ]
    assert got.allocs == [AllocRecord(4096, 10)]
    assert b.flush() == Records([], [], []) and fake_cupti.flushes == 2
    fake_cupti.pending = [act(kind=3, cbid=3, start=1, end=2, thread_id=1, correlation_id=1)]
    last = b.close()
    assert [a.name for a in last.apis] == ["cudaLaunchKernel"]  # what was still buffered
    assert fake_cupti.activities == [] and fake_cupti.unsubscribed == [42]
    assert set(fake_cupti.api_records.values()) == {1}  # every call recorded again for the next CUPTI client
    assert b.close() == Records([], [], [])  # twice: nothing more
    assert CuptiBindings().open() is None  # released
    cupti_mod._CLAIMED.clear()


def test_the_binding_says_why_cupti_is_not_there(fake_cupti: FakeCupti, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cupti.subscribe_error = RuntimeError("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)")
    reason = CuptiBindings().open()
    assert reason is not None and reason.startswith("CUPTI is held by another client in this process")
    assert "MULTIPLE_SUBSCRIBERS" in reason
    monkeypatch.setitem(sys.modules, "cupti", None)  # not installed
    assert CuptiBindings().open() == (
        "cupti-python is not installed (pip install 'flashcheck[gpu]' or pip install cupti-python)"
    )
