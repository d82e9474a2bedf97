"""The CUPTI layer on CPU: its callbacks through the checker (a fake backend plays CUPTI and the driver) and the
cupti-python binding's decoding of call parameters (a fake ``cupti`` module, parameter structs in ctypes memory)."""

from __future__ import annotations

import ctypes
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flashcheck.findings import Finding
from flashcheck.runtime import Checker
from flashcheck.runtime.hooks import cupti as cupti_mod
from flashcheck.runtime.hooks.cupti import CuptiBindings, CuptiHook, api_base_name, call_kind
from flashcheck.runtime.monitor import Memory


def here() -> int:
    return sys._getframe(1).f_lineno


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
    ("name", "kind"),
    [
        ("cudaStreamSynchronize", "sync"),
        ("cuCtxSynchronize", "sync"),
        ("cudaMemcpy", "sync"),  # a synchronous copy blocks the host
        ("cuMemcpyDtoH", "sync"),
        ("cudaMemcpyAsync", "copy"),
        ("cuMemcpyHtoDAsync", None),  # inside every cudaMemcpyAsync: watching it would double the cost
        ("cuMemcpyDtoHAsync", None),
        # made by torch under its allocator's lock: a callback waiting for the GIL there could deadlock
        ("cudaMalloc", None),
        ("cuMemAlloc", None),
        ("cudaFree", None),
        ("cudaEventSynchronize", None),
        ("cudaHostAlloc", None),
        ("cudaLaunchKernel", None),  # every other call costs nothing
        ("cudaGraphLaunch", None),
        ("cudaMemsetAsync", None),
        ("cudaStreamQuery", None),
    ],
)
def test_the_calls_the_layer_watches(name: str, kind: str | None) -> None:
    assert call_kind(name) == kind


# ----------------------------------------------------------------------------------------- the hook, with fakes
class FakeBackend:
    """Plays CUPTI and the driver: `call` is the watched code making a CUDA call (and, with `then`, a second call
    made by the same Python call, as torch's blocking copy makes a copy and a synchronize)."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.on_call: Callable[[str, Any, int, int], None] | None = None
        self.params: dict[int, tuple[Any, int, int]] = {}
        self.pinned: set[int] = set()
        self.unknown: set[int] = set()
        self.memory_queries: list[int] = []
        self.calls: list[str] = []

    def open(self) -> str | None:
        self.calls.append("open")
        return self.refuse

    def start(self, on_call: Callable[[str, Any, int, int], None]) -> None:
        self.calls.append("start")
        self.on_call = on_call

    def copy_args(self, name: str, params: int) -> tuple[Any, int, int]:
        assert call_kind(name) == "copy", name
        return self.params[params]

    def host_memory(self, ptr: int) -> Memory:
        self.memory_queries.append(ptr)
        return "unknown" if ptr in self.unknown else "pinned" if ptr in self.pinned else "pageable"

    def close(self) -> None:
        self.calls.append("close")
        self.on_call = None

    @property
    def callback_code(self) -> Any:
        return FakeBackend.call.__code__

    def call(
        self,
        name: str,
        corr: int,
        *,
        direction: str = "",
        host: int = 0,
        nbytes: int = 0,
        then: tuple[str, int] | None = None,
    ) -> None:
        assert self.on_call is not None, "the hook registered no callback"
        for call_name, call_corr in ((name, corr), *((then,) if then else ())):
            what = call_kind(call_name)
            assert what is not None
            params = len(self.params) + 1
            self.params[params] = (direction, host, nbytes)
            self.on_call(call_name, what, call_corr, params)


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
            backend.call("cudaStreamSynchronize", 5)
            backend.call("cuStreamSynchronize", 5)  # the driver call inside it: the same correlation, once
        f = only(chk.drain_findings(), "FC201")
    assert (f.location.file, f.location.line, f.location.step) == (__file__, line, 7)
    assert f.evidence["layers"] == ["cupti"] and f.evidence["details"] == ["cudaStreamSynchronize"]
    assert f.evidence["count"] == 1
    assert backend.calls == ["open", "start", "close"] and backend.on_call is None


def test_calls_outside_hot_regions_or_in_reads_are_quiet(fake: tuple[FakeBackend, CuptiHook]) -> None:
    backend, hook = fake
    with Checker(layers=[hook]) as chk:
        backend.call("cudaDeviceSynchronize", 1)  # no region
        with chk.region("capture"):
            backend.call("cudaDeviceSynchronize", 2)  # not a per-step region
            backend.call("cudaMemcpyAsync", 3, direction="DtoH", host=0x10, nbytes=4)
        with chk.region("replay", step=0), chk.checker_read():
            backend.call("cudaStreamSynchronize", 4)
            backend.call("cudaMemcpyAsync", 5, direction="DtoH", host=0x10, nbytes=4)
        assert chk.drain_findings() == [] and backend.memory_queries == []
        with chk.region("replay", step=1):
            for corr in (6, 7):  # two calls on one line: one finding, counted twice
                backend.call("cudaStreamSynchronize", corr)
        assert only(chk.drain_findings(), "FC201").evidence["count"] == 2


def test_copies_count_when_they_leave_the_device_or_come_from_pageable_memory(
    fake: tuple[FakeBackend, CuptiHook],
) -> None:
    backend, hook = fake
    backend.pinned = {0x1000}
    with Checker(layers=[hook]) as chk:
        for step in range(3):
            with chk.region("prepare_replay", step=step):
                for corr in (1, 2):  # one pinned address: asked once, then remembered
                    backend.call("cudaMemcpyAsync", 10 * step + corr, direction="HtoD", host=0x1000, nbytes=64)
        assert chk.drain_findings() == []
        assert backend.memory_queries == [0x1000]
        with chk.region("prepare_replay", step=3):
            pageable_line = here() + 1
            backend.call("cudaMemcpyAsync", 20, direction="HtoD", host=0x2000, nbytes=8)
            backend.call("cudaMemcpyAsync", 21, direction="other", host=0x2000, nbytes=8)  # device to device
        with chk.region("replay", step=3):
            d2h_line = here() + 1
            backend.call("cudaMemcpyAsync", 22, direction="DtoH", host=0x1000, nbytes=4)
        first, second = chk.drain_findings()
    assert (first.id, first.location.line, first.location.region) == ("FC201", pageable_line, "prepare_replay")
    assert first.evidence["details"] == ["Memcpy HtoD (Pageable -> Device) by cudaMemcpyAsync"]
    assert first.evidence["nbytes"] == 8
    assert (second.id, second.location.line, second.location.region) == ("FC201", d2h_line, "replay")
    assert second.evidence["details"] == ["Memcpy DtoH (Device -> Pinned) by cudaMemcpyAsync"]
    assert backend.memory_queries == [0x1000, 0x2000]  # a pageable address is not remembered


def test_a_pageable_address_registered_later_is_pinned_from_then_on(fake: tuple[FakeBackend, CuptiHook]) -> None:
    backend, hook = fake
    with Checker(layers=[hook]) as chk:
        with chk.region("prepare_replay", step=0):
            backend.call("cudaMemcpyAsync", 1, direction="HtoD", host=0x3000, nbytes=8)
        assert only(chk.drain_findings(), "FC201")
        backend.pinned.add(0x3000)  # cudaHostRegister, or the address reused by pinned memory
        with chk.region("prepare_replay", step=1):
            backend.call("cudaMemcpyAsync", 2, direction="HtoD", host=0x3000, nbytes=8)
        assert chk.drain_findings() == []
    assert backend.memory_queries == [0x3000, 0x3000]


def test_the_remembered_pinned_addresses_are_bounded(
    fake: tuple[FakeBackend, CuptiHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, hook = fake
    monkeypatch.setattr(cupti_mod, "_PINNED_CACHE_SIZE", 2)
    backend.pinned = {1, 2, 3}
    with Checker(layers=[hook]) as chk:
        with chk.region("prepare_replay", step=0):
            for corr, host in enumerate((1, 2, 3, 1, 3)):
                backend.call("cudaMemcpyAsync", corr + 1, direction="HtoD", host=host, nbytes=8)
        assert chk.drain_findings() == []
    assert backend.memory_queries == [1, 2, 3, 1]  # full at the third: forgotten, asked again


def test_a_blocking_copy_is_one_occurrence(fake: tuple[FakeBackend, CuptiHook]) -> None:
    """torch's blocking copy (``.item()``, ``.cpu()``) makes a cudaMemcpyAsync and a cudaStreamSynchronize from one
    Python call, with two correlation ids: one occurrence, as every other layer counts it."""
    backend, hook = fake
    with Checker(layers=[hook]) as chk:
        with chk.region("replay", step=0):
            for corr in (10, 20, 30):  # three blocking copies on one line: three occurrences
                backend.call(
                    "cudaMemcpyAsync",
                    corr,
                    direction="DtoH",
                    host=0x10,
                    nbytes=4,
                    then=("cudaStreamSynchronize", corr + 1),
                )
            backend.call("cudaStreamSynchronize", 40)  # a synchronize of its own: an occurrence of its own
        f, g = chk.drain_findings()
    assert f.evidence["count"] == 3 and f.evidence["details"] == ["Memcpy DtoH (Device -> Pageable) by cudaMemcpyAsync"]
    assert g.evidence["count"] == 1 and g.evidence["details"] == ["cudaStreamSynchronize"]


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
    hook.uninstall()
    assert ok.calls == ["open", "start", "close"]
    with pytest.raises(RuntimeError, match="CUPTI layer: busy"):
        CuptiHook(backend=FakeBackend(refuse="busy"), available=lambda: True).install(RecordingSink())

    class FailingStart(FakeBackend):
        def start(self, on_call: Callable[[str, Any, int, int], None]) -> None:
            raise OSError("no callbacks")

    failing = FailingStart()
    hook = CuptiHook(backend=failing, available=lambda: True)
    with pytest.raises(OSError, match="no callbacks"):
        hook.install(RecordingSink())
    assert failing.calls == ["open", "close"]  # released
    assert hook._opened is None


def test_an_error_in_the_callback_is_a_hook_error(
    fake: tuple[FakeBackend, CuptiHook], monkeypatch: pytest.MonkeyPatch
) -> None:
    from flashcheck.runtime.hooks import HookError

    backend, hook = fake

    def broken(frame: Any) -> tuple[()]:
        raise LookupError("no frames")

    monkeypatch.setattr(cupti_mod, "stack_from", broken)
    with pytest.raises(HookError, match="cupti: LookupError: no frames"), Checker(layers=[hook]) as chk:
        with chk.region("replay"):
            backend.call("cudaDeviceSynchronize", 1)  # CUPTI would only print the error: the checker raises it
        chk.drain_findings()


def test_a_late_callback_after_uninstall_is_dropped() -> None:
    from tests.runtime.test_hook_events import RecordingSink

    backend = FakeBackend()
    hook = CuptiHook(backend=backend, available=lambda: True)
    sink = RecordingSink()
    sink.hot = True  # the sink would still take an event from a hot region
    hook.install(sink)
    on_call = backend.on_call
    hook.uninstall()
    assert on_call is not None
    on_call("cudaDeviceSynchronize", "sync", 1, 0)  # CUPTI still delivering on another thread: nothing happens
    assert sink.events == [] and sink.errors == []


# ------------------------------------------------------------------------------------ the cupti-python binding
class FakeCupti(types.SimpleNamespace):
    """The parts of ``cupti.cupti`` the binding uses, recording what it was asked."""

    def __init__(self) -> None:
        super().__init__(CallbackDomain=types.SimpleNamespace(RUNTIME_API=2, DRIVER_API=1))
        self.names = {
            (2, 1): "cudaStreamSynchronize_v3020",
            (2, 2): "cudaMemcpyAsync_v3020",
            (2, 3): "cudaLaunchKernel_v7000",
            (2, 4): "cudaMalloc_v3020",  # not watched
            (2, 9): "cudaDeviceSynchronize_v3020",  # after a gap of ids this CUDA does not have
            (1, 1): "cuStreamSynchronize",
            (1, 2): "cuCtxSynchronize_v2",
            (1, 3): "cuMemcpyHtoDAsync_v2",  # not watched
            (1, 4): "cuMemcpyDtoH_v2",
        }
        self.subscribe_error: Exception | None = None
        self.subscribed = 0
        self.enabled: list[tuple[int, int]] = []
        self.unsubscribed: list[int] = []
        self.callback: Any = None

    def subscribe(self, callback: Any, userdata: Any) -> int:
        if self.subscribe_error is not None:
            raise self.subscribe_error
        self.subscribed += 1
        self.callback = callback
        return 42

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return self.names[(int(domain), cbid)]

    def enable_callback(self, on: int, sub: int, domain: int, cbid: int) -> None:
        assert on == 1 and sub == 42
        self.enabled.append((domain, cbid))

    def unsubscribe(self, sub: int) -> None:
        self.unsubscribed.append(sub)


def cb(site: int, corr: int, params: int = 0) -> types.SimpleNamespace:
    return types.SimpleNamespace(callback_site=site, correlation_id=corr, function_params=params)


@pytest.fixture
def fake_cupti(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCupti]:
    mod = FakeCupti()
    pkg = types.ModuleType("cupti")
    pkg.cupti = mod  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", pkg)
    yield mod
    cupti_mod._CLAIMED.clear()


def test_the_binding_enables_the_watched_calls_and_passes_them_on(fake_cupti: FakeCupti) -> None:
    b = CuptiBindings()
    assert b.open() is None
    assert CuptiBindings().open() == (
        "another checker's CUPTI layer is active in this process (CUPTI has one subscriber per process)"
    )
    seen: list[tuple[str, str, int, int]] = []
    b.start(lambda name, what, corr, params: seen.append((name, what, corr, params)))
    assert sorted(fake_cupti.enabled) == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 9)]  # no launch, no malloc
    call = fake_cupti.callback
    call(None, 2, 1, cb(0, 9))
    call(None, 2, 1, cb(1, 9))  # the exit site: ignored
    call(None, 2, 2, cb(0, 10, 0x100))
    call(None, 2, 3, cb(0, 11))  # not enabled (a launch): ignored
    assert seen == [("cudaStreamSynchronize", "sync", 9, 0), ("cudaMemcpyAsync", "copy", 10, 0x100)]
    b.close()
    call(None, 2, 1, cb(0, 12))  # after close: nothing
    assert len(seen) == 2 and fake_cupti.unsubscribed == [42]
    b.close()  # twice: nothing more
    assert CuptiBindings().open() is None  # released


def test_the_binding_says_why_cupti_is_not_there(fake_cupti: FakeCupti, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cupti.subscribe_error = RuntimeError("ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)")
    reason = CuptiBindings().open()
    assert reason is not None and reason.startswith("CUPTI is held by another client in this process")
    assert "MULTIPLE_SUBSCRIBERS" in reason
    old = types.ModuleType("cupti")  # an older cupti-python: activity records only
    old.cupti = types.SimpleNamespace(  # type: ignore[attr-defined]
        subscribe=fake_cupti.subscribe, unsubscribe=fake_cupti.unsubscribe, get_callback_name=None, CallbackDomain=None
    )
    monkeypatch.setitem(sys.modules, "cupti", old)
    assert CuptiBindings().open() == (
        "this cupti-python has no callback API (enable_callback missing): install cupti-python>=13.2"
    )
    broken = types.ModuleType("cupti")
    broken.__getattr__ = lambda name: (_ for _ in ()).throw(OSError("libcupti.so.13: cannot open"))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", broken)
    assert CuptiBindings().open() == "cupti-python does not load here: OSError: libcupti.so.13: cannot open"
    monkeypatch.setitem(sys.modules, "cupti", None)  # not installed
    assert CuptiBindings().open() == (
        "cupti-python is not installed (pip install 'flashcheck[gpu]' or pip install cupti-python)"
    )


class MemcpyAsyncParams(ctypes.Structure):
    _fields_ = (  # ctypes reads the class attribute
        ("dst", ctypes.c_void_p),
        ("src", ctypes.c_void_p),
        ("count", ctypes.c_size_t),
        ("kind", ctypes.c_int),
        ("stream", ctypes.c_void_p),
    )


class Driver:
    """libcuda's cuPointerGetAttribute(MEMORY_TYPE) over a table: address -> (error, memory type)."""

    def __init__(self, table: dict[int, tuple[int, int]]) -> None:
        self.table, self.asked = table, []

    def cuPointerGetAttribute(self, out: Any, attr: int, ptr: Any) -> int:  # the driver's name
        self.asked.append((attr, ptr.value))
        err, kind = self.table[ptr.value]
        out._obj.value = kind
        return err


DEVICE, PINNED, PAGEABLE = (0, 2), (0, 1), (1, 0)


@pytest.mark.parametrize(
    ("kind", "memory", "want"),
    [
        (1, {}, ("HtoD", 0xB0, 64)),  # cudaMemcpyHostToDevice: the host side is src
        (2, {}, ("DtoH", 0xA0, 64)),  # cudaMemcpyDeviceToHost: the host side is dst
        (3, {}, ("other", 0xA0, 64)),  # device to device
        (0, {}, ("other", 0xA0, 64)),  # host to host
        # cudaMemcpyDefault: unified addressing, the driver says where each side lives
        (4, {0xA0: DEVICE, 0xB0: PAGEABLE}, ("HtoD", 0xB0, 64)),
        (4, {0xA0: PINNED, 0xB0: DEVICE}, ("DtoH", 0xA0, 64)),
        (4, {0xA0: DEVICE, 0xB0: DEVICE}, ("other", 0, 64)),
        (4, {0xA0: PAGEABLE, 0xB0: PINNED}, ("other", 0, 64)),
    ],
)
def test_the_binding_reads_cudamemcpyasync_arguments(
    kind: int, memory: dict[int, tuple[int, int]], want: tuple[str, int, int]
) -> None:
    p = MemcpyAsyncParams(0xA0, 0xB0, 64, kind, 0)
    b = CuptiBindings()
    b._libcuda = Driver(memory)
    assert b.copy_args("cudaMemcpyAsync", ctypes.addressof(p)) == want
    assert len(b._libcuda.asked) == (2 if kind == 4 else 0)


def test_the_binding_asks_the_driver_whether_memory_is_pinned() -> None:
    b = CuptiBindings()
    # pinned; pageable (CUDA_ERROR_INVALID_VALUE: an address the driver does not know); device memory; and an
    # error that says nothing of the address (CUDA_ERROR_DEINITIALIZED): unknown, never a pageable finding
    table = {0x1: PINNED, 0x2: PAGEABLE, 0x3: DEVICE, 0x4: (4, 0)}
    b._libcuda = Driver(table)
    assert [b.host_memory(ptr) for ptr in table] == ["pinned", "pageable", "unknown", "unknown"]
    assert b._libcuda.asked == [(2, ptr) for ptr in table]  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE


def test_the_stack_starts_above_the_backends_callback_or_holds_everything() -> None:
    class Elsewhere(FakeBackend):
        @property
        def callback_code(self) -> Any:
            return (lambda: None).__code__  # never on the stack: the whole stack is kept

    for backend in (FakeBackend(), Elsewhere()):
        with Checker(layers=[CuptiHook(backend=backend, available=lambda: True)]) as chk:
            with chk.region("replay", step=0):
                line = here() + 1
                backend.call("cudaDeviceSynchronize", 1)
            (f,) = chk.drain_findings()
        names = [fr.function for fr in f.stack]
        assert "test_the_stack_starts_above_the_backends_callback_or_holds_everything" in names
        if isinstance(backend, Elsewhere):  # the fake's own frame and everything inside it are kept
            assert names.index("call") > names.index(
                "test_the_stack_starts_above_the_backends_callback_or_holds_everything"
            )
        else:
            assert "call" not in names and f.location.line == line
    assert CuptiBindings().callback_code is CuptiBindings._callback.__code__


def test_the_hooks_events_in_full() -> None:
    """What the hook hands the checker for each kind of call: kind, layer, detail, memory, bytes and the thread."""
    import threading

    from tests.runtime.test_hook_events import RecordingSink

    backend = FakeBackend()
    backend.pinned = {0x10}
    hook = CuptiHook(backend=backend, available=lambda: True)
    sink = RecordingSink()
    sink.hot = True
    hook.install(sink)
    backend.call("cudaMemcpyAsync", 1, direction="HtoD", host=0x10, nbytes=8)  # pinned: nothing to say
    backend.call("cudaMemcpyAsync", 2, direction="HtoD", host=0x20, nbytes=8)
    backend.call("cudaMemcpyAsync", 3, direction="DtoH", host=0x10, nbytes=4)
    backend.call("cudaStreamSynchronize", 5)
    backend.unknown.add(0x30)  # managed memory, say
    backend.call("cudaMemcpyAsync", 6, direction="DtoH", host=0x30, nbytes=2)
    hook.uninstall()
    me = threading.get_ident()
    assert [(e.kind, e.layer, e.detail, e.memory, e.nbytes, e.thread) for e in sink.events] == [
        ("h2d_copy", "cupti", "Memcpy HtoD (Pageable -> Device) by cudaMemcpyAsync", "pageable", 8, me),
        ("d2h_copy", "cupti", "Memcpy DtoH (Device -> Pinned) by cudaMemcpyAsync", "pinned", 4, me),
        ("sync", "cupti", "cudaStreamSynchronize", "unknown", None, me),
        ("d2h_copy", "cupti", "Memcpy DtoH (Device -> Host) by cudaMemcpyAsync", "unknown", 2, me),
    ]
    assert all(e.stack and e.stack[-1].function == "test_the_hooks_events_in_full" for e in sink.events)


def test_a_pageable_copy_is_a_host_to_device_finding() -> None:
    backend = FakeBackend()
    with Checker(layers=[CuptiHook(backend=backend, available=lambda: True)]) as chk:
        with chk.region("prepare_replay", step=0):
            backend.call("cudaMemcpyAsync", 1, direction="HtoD", host=0x20, nbytes=8)
        (f,) = chk.drain_findings()
    assert f.message.startswith("host-to-device copy from pageable memory") and f.evidence["layers"] == ["cupti"]


def test_with_the_c_filter_off_the_default_backend_is_the_cupti_python_binding(
    fake_cupti: FakeCupti, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLASHCHECK_CUPTI_FILTER", "0")  # the filter's own tests: tests/runtime/test_cupti_filter.py
    hook = CuptiHook(available=lambda: True)
    assert hook.unavailable_reason() is None and type(hook._opened) is CuptiBindings
    assert hook.unavailable_reason() is None and fake_cupti.subscribed == 1  # asked twice: claimed once
    cupti_mod._CLAIMED.clear()
    hook = CuptiHook(available=lambda: True)
    from tests.runtime.test_hook_events import RecordingSink

    hook.install(RecordingSink())  # without asking first: it opens the binding itself
    assert type(hook._opened) is CuptiBindings
    hook.uninstall()
    loaded: list[str] = []

    class Driver:
        def __init__(self, name: str) -> None:
            loaded.append(name)

        def cuPointerGetAttribute(self, out: Any, attr: int, ptr: Any) -> int:  # the driver's name
            return 1

    monkeypatch.setattr(cupti_mod.ctypes, "CDLL", Driver)
    b = CuptiBindings()
    assert b.host_memory(0x40) == b.host_memory(0x50) == "pageable"
    assert loaded == ["libcuda.so.1"]  # loaded once, on first use
