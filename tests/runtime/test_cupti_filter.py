"""The cupti layer's C filter on CPU: compiled here, called the way CUPTI calls it (callback data and parameter structs
in ctypes memory, the driver's cuPointerGetAttribute played by a ctypes callback), and wired into the hook through a
fake libcupti. What it answers in C never reaches Python; everything the layer may report does, once."""

from __future__ import annotations

import ctypes
import re
import shutil
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flashcheck.runtime import Checker
from flashcheck.runtime.hooks import cupti as cupti_mod
from flashcheck.runtime.hooks import cupti_native
from flashcheck.runtime.hooks.cupti import CuptiBindings, CuptiHook
from flashcheck.runtime.hooks.cupti_native import CuptiNative, build_filter, load_filter

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler to build the cupti C filter"
)

ENTER, EXIT = 0, 1
DRIVER, RUNTIME = 1, 2
SYNC_ID, COPY_ID, DRIVER_SYNC_ID = 5, 41, 7
H2D, D2H, D2D, H2H, DEFAULT = 1, 2, 3, 0, 4
PINNED, DEVICE = 1, 2  # CU_MEMORYTYPE_HOST / _DEVICE
INVALID_VALUE, DEINITIALIZED = 1, 4


class CallbackData(ctypes.Structure):
    """CUpti_CallbackData as cupti_callbacks.h lays it out."""

    _fields_ = (
        ("callback_site", ctypes.c_int),
        ("function_name", ctypes.c_char_p),
        ("function_params", ctypes.c_void_p),
        ("function_return_value", ctypes.c_void_p),
        ("symbol_name", ctypes.c_char_p),
        ("context", ctypes.c_void_p),
        ("context_uid", ctypes.c_uint32),
        ("correlation_data", ctypes.c_void_p),
        ("correlation_id", ctypes.c_uint32),
    )


class MemcpyAsyncParams(ctypes.Structure):
    _fields_ = (
        ("dst", ctypes.c_uint64),
        ("src", ctypes.c_uint64),
        ("count", ctypes.c_size_t),
        ("kind", ctypes.c_int),
        ("stream", ctypes.c_void_p),
    )


FORWARD = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)
GET_ATTRIBUTE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.c_int, ctypes.c_uint64)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_filter(tmp_path_factory.mktemp("cupti-filter"))
    assert isinstance(path, Path), path
    return path


class Filter:
    """The loaded filter with a recording forward function and a driver over a table of address -> memory type
    (an address not in the table is pageable: the driver answers CUDA_ERROR_INVALID_VALUE)."""

    def __init__(self, path: Path) -> None:
        self.lib = load_filter(path)
        self.forwarded: list[tuple[int, int, int, int]] = []
        self.memory: dict[int, int | str] = {}
        self.asked: list[int] = []
        self._forward = FORWARD(lambda d, c, corr, p: self.forwarded.append((d, c, corr, p or 0)))
        self._get = GET_ATTRIBUTE(self._attribute)
        self.lib.fc_reset(ctypes.cast(self._forward, ctypes.c_void_p), ctypes.cast(self._get, ctypes.c_void_p))
        self.lib.fc_set_call(RUNTIME, SYNC_ID, 1)
        self.lib.fc_set_call(DRIVER, DRIVER_SYNC_ID, 1)
        self.lib.fc_set_call(RUNTIME, COPY_ID, 2)
        self._keep: list[Any] = []

    def _attribute(self, out: Any, attribute: int, ptr: int) -> int:
        assert attribute == 2  # CU_POINTER_ATTRIBUTE_MEMORY_TYPE
        self.asked.append(ptr)
        kind = self.memory.get(ptr)
        if kind is None:
            return INVALID_VALUE
        if kind == "error":
            return DEINITIALIZED
        out[0] = int(kind)
        return 0

    def call(self, domain: int, cbid: int, corr: int, *, site: int = ENTER, params: Any = None) -> None:
        self._keep.append(params)
        address = ctypes.addressof(params) if params is not None else None
        data = CallbackData(site, b"fn", address, None, None, None, 0, None, corr)
        self.lib.fc_callback(None, domain, cbid, ctypes.byref(data))

    def copy(self, corr: int, kind: int, dst: int, src: int) -> MemcpyAsyncParams:
        params = MemcpyAsyncParams(dst, src, 64, kind, None)
        self.call(RUNTIME, COPY_ID, corr, params=params)
        return params

    def counts(self) -> tuple[int, int]:
        return int(self.lib.fc_forwarded()), int(self.lib.fc_answered())


@pytest.fixture
def flt(built: Path) -> Iterator[Filter]:
    f = Filter(built)
    yield f
    f.lib.fc_stop()


def test_blocking_calls_reach_python_once_per_correlation_and_only_as_they_enter(flt: Filter) -> None:
    flt.call(RUNTIME, SYNC_ID, 7)
    flt.call(DRIVER, DRIVER_SYNC_ID, 7)  # the driver call inside it: the same correlation id
    flt.call(RUNTIME, SYNC_ID, 8, site=EXIT)
    flt.call(RUNTIME, 99, 9)  # a call the layer does not watch
    flt.call(3, SYNC_ID, 10)  # another domain
    flt.call(RUNTIME, SYNC_ID, 11)
    assert flt.forwarded == [(RUNTIME, SYNC_ID, 7, 0), (RUNTIME, SYNC_ID, 11, 0)]


def test_a_pinned_host_to_device_copy_is_answered_in_c_and_its_address_remembered(flt: Filter) -> None:
    flt.memory = {0xB0: PINNED}
    flt.copy(1, H2D, 0xA0, 0xB0)
    flt.copy(2, H2D, 0xA0, 0xB0)
    assert flt.forwarded == [] and flt.asked == [0xB0] and flt.counts() == (0, 2)


def test_copies_the_layer_may_report_reach_python_with_their_parameters(flt: Filter) -> None:
    pageable = flt.copy(1, H2D, 0xA0, 0xC0)
    again = flt.copy(2, H2D, 0xA0, 0xC0)  # a pageable address is asked again: it may be registered later
    out = flt.copy(3, D2H, 0xC0, 0xA0)
    flt.memory = {0xD0: "error"}  # the driver cannot say: Python decides
    unknown = flt.copy(4, H2D, 0xA0, 0xD0)
    assert [f[3] for f in flt.forwarded] == [ctypes.addressof(p) for p in (pageable, again, out, unknown)]
    assert flt.asked == [0xC0, 0xC0, 0xD0]  # never asked for a device-to-host copy
    flt.memory = {0xC0: PINNED}  # registered now
    flt.copy(5, H2D, 0xA0, 0xC0)
    assert len(flt.forwarded) == 4 and flt.counts() == (4, 1)


def test_copies_without_a_host_side_are_answered_without_asking(flt: Filter) -> None:
    flt.copy(1, D2D, 0xA0, 0xB0)
    flt.copy(2, H2H, 0xA0, 0xB0)
    assert flt.forwarded == [] and flt.asked == []


@pytest.mark.parametrize(
    ("memory", "to_python"),
    [
        ({0xA0: DEVICE}, True),  # pageable source
        ({0xA0: DEVICE, 0xB0: PINNED}, False),
        ({0xA0: PINNED, 0xB0: DEVICE}, True),  # device to host
        ({0xB0: DEVICE}, True),  # device to pageable host
        ({0xA0: DEVICE, 0xB0: DEVICE}, False),
        ({}, False),  # host to host
        ({0xA0: "error", 0xB0: DEVICE}, True),
    ],
)
def test_a_default_kind_copy_asks_the_driver_where_each_side_lives(
    flt: Filter, memory: dict[int, int | str], to_python: bool
) -> None:
    flt.memory = memory
    flt.copy(1, DEFAULT, 0xA0, 0xB0)
    assert bool(flt.forwarded) is to_python


def test_the_remembered_pinned_addresses_are_bounded_and_stay_right(flt: Filter) -> None:
    flt.memory = {0x1000 * (i + 1): PINNED for i in range(5000)}
    for i in range(5000):  # the table holds 4096: it is cleared at the 4097th
        flt.copy(i + 1, H2D, 0xA0, 0x1000 * (i + 1))
    assert len(flt.asked) == 5000
    for i in range(4500, 5000):  # remembered since the table was cleared
        flt.copy(10_000 + i, H2D, 0xA0, 0x1000 * (i + 1))
    assert len(flt.asked) == 5000
    flt.copy(20_000, H2D, 0xA0, 0x1000)  # forgotten: asked again, still answered in C
    assert flt.asked[-1] == 0x1000 and len(flt.asked) == 5001 and flt.forwarded == []


def test_a_null_source_is_asked_of_the_driver_like_any_address(flt: Filter) -> None:
    flt.copy(1, H2D, 0xA0, 0)  # 0 marks an empty slot of the pinned set: it must never read as remembered
    assert len(flt.forwarded) == 1 and flt.asked == [0]


def test_an_unknown_copy_kind_has_no_host_side_to_report(flt: Filter) -> None:
    flt.copy(1, 5, 0xA0, 0xB0)
    assert flt.forwarded == [] and flt.asked == []


def test_a_reset_forgets_the_pinned_addresses(flt: Filter, built: Path) -> None:
    flt.memory = {0xB0: PINNED}
    flt.copy(1, H2D, 0xA0, 0xB0)
    again = Filter(built)  # the next checker: the address was unregistered meanwhile
    again.copy(2, H2D, 0xA0, 0xB0)
    assert len(again.forwarded) == 1 and again.asked == [0xB0]


def test_the_correlation_of_one_thread_never_hides_another_threads_call(flt: Filter) -> None:
    import threading

    flt.call(RUNTIME, SYNC_ID, 7)
    other = threading.Thread(target=flt.call, args=(RUNTIME, SYNC_ID, 7))
    other.start()
    other.join()
    assert [f[2] for f in flt.forwarded] == [7, 7]


def test_a_stopped_filter_forwards_nothing(flt: Filter) -> None:
    flt.lib.fc_stop()
    flt.call(RUNTIME, SYNC_ID, 1)
    assert flt.forwarded == []


# ---------------------------------------------------------------------------------------------------- building
def test_a_build_is_kept_and_reused(tmp_path: Path) -> None:
    first = build_filter(tmp_path)
    assert isinstance(first, Path) and first.parent == tmp_path
    inode = first.stat().st_ino
    assert build_filter(tmp_path) == first and first.stat().st_ino == inode
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary left behind


def test_a_build_that_cannot_happen_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "cc-broken"
    broken.write_text("#!/bin/sh\necho 'cc: fatal error: no input' >&2\nexit 1\n")
    broken.chmod(0o755)
    reason = build_filter(tmp_path / "a", compiler=str(broken))
    assert isinstance(reason, str) and reason.endswith(
        "could not build the cupti layer's C filter: cc: fatal error: no input"
    )
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert build_filter(tmp_path / "b") == "no C compiler (set $CC or install cc) to build the cupti layer's C filter"


def test_a_build_never_replaces_what_is_not_a_regular_file(tmp_path: Path, built: Path) -> None:
    (tmp_path / built.name).mkdir()  # the cached name is taken by a directory
    reason = build_filter(tmp_path)
    assert isinstance(reason, str) and "is a directory" in reason and (tmp_path / built.name).is_dir()


def test_a_build_where_nothing_can_be_kept_is_a_reason_not_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*args: Any, **kwargs: Any) -> Any:  # an existing cache directory this user may not write
        raise PermissionError(13, "Permission denied")

    with monkeypatch.context() as mp:  # patched, not chmod: root writes anywhere
        mp.setattr(cupti_native.tempfile, "mkstemp", read_only)
        reason = build_filter(tmp_path)
    assert isinstance(reason, str) and "could not build" in reason and "Permission denied" in reason
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the cache directory's path is a file
    reason = build_filter(blocked / "cache")
    assert isinstance(reason, str) and reason.startswith(f"cannot keep the cupti layer's C filter in {blocked}")
    for name in ("FLASHCHECK_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    reason = build_filter()
    assert isinstance(reason, str) and reason.startswith("cannot keep the cupti layer's C filter")


def test_a_cached_build_others_may_write_is_not_loaded(tmp_path: Path) -> None:
    path = build_filter(tmp_path)
    assert isinstance(path, Path)
    path.chmod(0o666)
    reason = build_filter(tmp_path)
    assert isinstance(reason, str) and reason.endswith("is not this user's alone (owner or write permission)")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # a cache directory anyone may write: built, never loaded
    reason = build_filter(shared)
    assert reason == f"{shared} may be written by others: the filter is not loaded"


def test_the_cache_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLASHCHECK_CACHE_DIR", str(tmp_path / "x"))
    assert cupti_native.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("FLASHCHECK_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cupti_native.cache_dir() == tmp_path / "xdg" / "flashcheck"


# ------------------------------------------------------------------------------------ the hook over the filter
class FakeLibcupti:
    """libcupti's subscriber calls (functions, as ctypes has them: the backend declares their argument types): it
    keeps the C callback the native backend subscribes."""

    def __init__(self) -> None:
        self.callback: int | None = None
        self.enabled: list[tuple[int, int]] = []
        self.unsubscribed = 0

        def subscribe(handle: Any, callback: Any, userdata: Any) -> int:
            self.callback = callback.value
            handle._obj.value = 0x5B
            return 0

        def enable(on: int, sub: int, domain: int, cbid: int) -> int:
            assert on == 1 and sub == 0x5B
            self.enabled.append((domain, cbid))
            return 0

        def unsubscribe(sub: int) -> int:
            self.unsubscribed += 1
            return 0

        self.cuptiSubscribe, self.cuptiEnableCallback, self.cuptiUnsubscribe = subscribe, enable, unsubscribe


@pytest.fixture
def native(built: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeLibcupti, Filter]]:
    fake = types.SimpleNamespace(
        subscribe=None,  # what the native backend never calls: CUPTI calls its C function
        unsubscribe=None,
        enable_callback=None,
        CallbackDomain=types.SimpleNamespace(RUNTIME_API=RUNTIME, DRIVER_API=DRIVER),
        get_callback_name=lambda d, c: {
            (RUNTIME, SYNC_ID): "cudaDeviceSynchronize_v3020",
            (RUNTIME, COPY_ID): "cudaMemcpyAsync_v3020",
        }[(int(d), c)],
    )
    pkg = types.ModuleType("cupti")
    pkg.cupti = fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cupti", pkg)
    lib = FakeLibcupti()
    monkeypatch.setattr(cupti_native, "_loaded_libcupti", lambda: lib)
    monkeypatch.setenv("FLASHCHECK_CACHE_DIR", str(built.parent))
    driver = Filter(built)  # its driver callback plays libcuda
    monkeypatch.setattr(CuptiNative, "_cuda", lambda self: types.SimpleNamespace(cuPointerGetAttribute=driver._get))
    yield lib, driver
    cupti_mod._CLAIMED.clear()


def test_the_hook_over_the_filter_reports_at_the_users_line(native: tuple[FakeLibcupti, Filter]) -> None:
    lib, driver = native
    hook = CuptiHook(available=lambda: True)
    assert hook.unavailable_reason() is None and hook.backend_note == "C filter"
    assert isinstance(hook._opened, CuptiNative)
    driver.memory = {0xB0: PINNED}
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)(lib.callback)
    keep = []

    def cuda_call(cbid: int, corr: int, params: Any = None) -> None:  # CUPTI calling back inside a CUDA call
        keep.append(params)
        data = CallbackData(ENTER, b"fn", ctypes.addressof(params) if params else None, None, None, None, 0, None, corr)
        callback(None, RUNTIME, cbid, ctypes.byref(data))

    with Checker(layers=[hook]) as chk:
        assert sorted(lib.enabled) == [(RUNTIME, SYNC_ID), (RUNTIME, COPY_ID)]
        with chk.region("prepare_replay", step=3):
            cuda_call(COPY_ID, 1, MemcpyAsyncParams(0xA0, 0xB0, 64, H2D, None))  # pinned: answered in C
            line = sys._getframe().f_lineno + 1
            cuda_call(SYNC_ID, 2)
        (f,) = chk.drain_findings()
        assert hook._opened is not None and hook._opened.counts() == (1, 1)  # type: ignore[attr-defined]
    # the CUDA call is made in cuda_call: the stack begins above the filter's forwarding function
    assert f.id == "FC201" and f.location.function == "cuda_call" and f.location.step == 3
    assert (f.stack[-1].function, f.stack[-2].line) == ("cuda_call", line)
    assert "cudaDeviceSynchronize" in f.message and f.evidence["layers"] == ["cupti"]
    assert lib.unsubscribed == 1 and hook._opened is None
    cuda_call(SYNC_ID, 3)  # after the checker closed: the filter is stopped, nothing is counted or forwarded
    assert driver.counts() == (1, 1)  # the same loaded filter, seen through the test's handle


def test_without_the_filter_the_hook_runs_on_python_callbacks_and_says_why(
    native: tuple[FakeLibcupti, Filter], monkeypatch: pytest.MonkeyPatch, built: Path
) -> None:
    lib, _ = native
    subscribed: list[Any] = []
    fake = sys.modules["cupti"].cupti  # type: ignore[attr-defined]
    fake.subscribe = lambda cb, data: subscribed.append(cb) or 42
    fake.enable_callback = lambda *a: None
    fake.unsubscribe = lambda sub: None
    monkeypatch.setenv("FLASHCHECK_CUPTI_FILTER", "0")
    hook = CuptiHook(available=lambda: True)
    assert hook.unavailable_reason() is None and type(hook._opened) is CuptiBindings
    assert hook.backend_note == "Python callbacks: FLASHCHECK_CUPTI_FILTER=0" and len(subscribed) == 1
    hook._opened.close()  # type: ignore[union-attr]
    monkeypatch.delenv("FLASHCHECK_CUPTI_FILTER")

    def not_loaded() -> Any:
        raise OSError("libcupti is not loaded in this process")

    monkeypatch.setattr(cupti_native, "_loaded_libcupti", not_loaded)
    hook = CuptiHook(available=lambda: True)
    assert hook.unavailable_reason() is None and type(hook._opened) is CuptiBindings
    assert hook.backend_note == "Python callbacks: the C filter does not load: libcupti is not loaded in this process"
    hook._opened.close()  # type: ignore[union-attr]
    monkeypatch.setenv("PATH", str(built.parent / "no-such-bin"))
    monkeypatch.delenv("CC", raising=False)
    hook = CuptiHook(available=lambda: True)
    assert hook.unavailable_reason() is None and type(hook._opened) is CuptiBindings
    assert (
        hook.backend_note
        == "Python callbacks: no C compiler (set $CC or install cc) to build the cupti layer's C filter"
    )
    hook._opened.close()  # type: ignore[union-attr]
    assert lib.callback is None
    monkeypatch.delenv("PATH")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("unexpected")

    monkeypatch.setattr(cupti_native, "build_filter", broken)
    hook = CuptiHook(available=lambda: True)
    assert hook.unavailable_reason() is None and type(hook._opened) is CuptiBindings
    assert hook.backend_note == "Python callbacks: the C filter failed: ValueError: unexpected"
    hook._opened.close()  # type: ignore[union-attr]


def test_with_two_libcupti_loaded_the_filter_steps_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    maps = "7f00-7f01 r-xp 0 0:0 1 /usr/lib/libcupti.so.12\n7f02-7f03 r-xp 0 0:0 1 /opt/cupti/libcupti.so.13\n"
    monkeypatch.setattr(cupti_native, "open", lambda *a, **k: io.StringIO(maps), raising=False)
    listed = "2 libcupti libraries are loaded in this process: /opt/cupti/libcupti.so.13, /usr/lib/libcupti.so.12"
    with pytest.raises(OSError, match=re.escape(listed)):
        cupti_native._loaded_libcupti()
