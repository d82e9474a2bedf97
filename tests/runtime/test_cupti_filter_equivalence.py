"""The cupti layer reports the same events over its C filter as over cupti-python's Python callbacks: random
sequences of CUDA calls (blocking calls, their driver twins, asynchronous copies of every kind between pinned,
pageable, device, null and unclassifiable addresses, entries and exits) go through both, on CPU, and the events the
hook emits must agree one for one."""

from __future__ import annotations

import ctypes
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashcheck.runtime.hooks import cupti as cupti_mod
from flashcheck.runtime.hooks import cupti_native
from flashcheck.runtime.hooks.cupti import CuptiBindings, CuptiHook
from flashcheck.runtime.hooks.cupti_native import CuptiNative, build_filter
from tests.runtime.test_cupti_filter import CallbackData, FakeLibcupti, MemcpyAsyncParams
from tests.runtime.test_hook_events import RecordingSink

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler to build the cupti C filter"
)

RUNTIME, DRIVER = 2, 1
NAMES = {
    (RUNTIME, 5): "cudaStreamSynchronize_v3020",
    (RUNTIME, 41): "cudaMemcpyAsync_v3020",
    (DRIVER, 7): "cuStreamSynchronize",
}
SYNC, COPY, DRIVER_SYNC = (RUNTIME, 5), (RUNTIME, 41), (DRIVER, 7)
# the driver's view of each address: pinned, device, unclassifiable (an error other than "unknown"); others pageable
MEMORY: dict[int, int | str] = {0x100: 1, 0x200: 2, 0x400: "error"}
ADDRESSES = (0, 0x100, 0x200, 0x300, 0x400)
GET_ATTRIBUTE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint), ctypes.c_int, ctypes.c_void_p)


def _attribute(out: Any, attribute: int, ptr: int | None) -> int:
    """cuPointerGetAttribute(MEMORY_TYPE) over `MEMORY`, for the C filter and the Python path alike."""
    kind = MEMORY.get(ptr or 0)
    if kind is None:
        return 1  # CUDA_ERROR_INVALID_VALUE: memory the driver does not know
    if kind == "error":
        return 4
    out[0] = int(kind)
    return 0


_GET = GET_ATTRIBUTE(_attribute)
_DRIVER = types.SimpleNamespace(cuPointerGetAttribute=_GET)


class FakeCupti(types.SimpleNamespace):
    """``cupti.cupti`` for the Python path: it keeps the subscribed callback."""

    def __init__(self) -> None:
        super().__init__(CallbackDomain=types.SimpleNamespace(RUNTIME_API=RUNTIME, DRIVER_API=DRIVER))
        self.callback: Any = None

    def subscribe(self, callback: Any, userdata: Any) -> int:
        self.callback = callback
        return 42

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return NAMES[(int(domain), cbid)]

    def enable_callback(self, *args: Any) -> None:
        return None

    def unsubscribe(self, sub: int) -> None:
        return None


call = st.one_of(
    st.tuples(st.sampled_from(["sync", "driver-sync"]), st.just(0), st.just(0), st.just(0), st.booleans()),
    st.tuples(
        st.just("copy"),
        st.sampled_from([0, 1, 2, 3, 4, 5]),  # cudaMemcpyKind, and one no CUDA has
        st.sampled_from(ADDRESSES),
        st.sampled_from(ADDRESSES),
        st.booleans(),  # a new correlation id, or the one of the call before (a driver call inside it)
    ),
)


def _events(sink: RecordingSink) -> list[tuple[str, str, str, int | None]]:
    return [(e.kind, e.detail, e.memory, e.nbytes) for e in sink.events]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = build_filter(tmp_path_factory.mktemp("cupti-filter-eq"))
    assert isinstance(path, Path), path
    return path


@settings(max_examples=60, deadline=None)
@given(calls=st.lists(call, min_size=1, max_size=25))
def test_the_c_filter_and_the_python_callbacks_report_the_same_events(
    built: Path, calls: list[tuple[str, int, int, int, bool]]
) -> None:
    fake = FakeCupti()
    pkg = types.ModuleType("cupti")
    pkg.cupti = fake  # type: ignore[attr-defined]
    lib = FakeLibcupti()
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "cupti", pkg)
        mp.setattr(cupti_native, "_loaded_libcupti", lambda: lib)
        mp.setattr(CuptiBindings, "_cuda", lambda self: _DRIVER)
        mp.setenv("FLASHCHECK_CACHE_DIR", str(built.parent))
        sinks = {}
        for mode in ("1", "0"):  # the C filter, then the Python callbacks
            mp.setenv("FLASHCHECK_CUPTI_FILTER", mode)
            hook = CuptiHook(available=lambda: True)
            assert hook.unavailable_reason() is None
            assert isinstance(hook._opened, CuptiNative) is (mode == "1"), hook.backend_note
            sink = sinks[mode] = RecordingSink()
            sink.hot = True
            hook.install(sink)
            try:
                _replay(calls, mode, fake, lib)
            finally:
                hook.uninstall()
                cupti_mod._CLAIMED.clear()
    assert _events(sinks["1"]) == _events(sinks["0"])
    assert sinks["1"].errors == sinks["0"].errors == []


def _replay(calls: list[tuple[str, int, int, int, bool]], mode: str, fake: FakeCupti, lib: FakeLibcupti) -> None:
    c_callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)(
        lib.callback or 0
    )
    correlation = 1000
    keep: list[Any] = []
    for what, kind, dst, src, fresh in calls:
        correlation += 1 if fresh else 0
        domain, cbid = {"sync": SYNC, "driver-sync": DRIVER_SYNC, "copy": COPY}[what]
        params = MemcpyAsyncParams(dst, src, 64, kind, None) if what == "copy" else None
        keep.append(params)
        address = ctypes.addressof(params) if params is not None else None
        for site in (0, 1):  # CUPTI calls back as the call enters and as it returns
            if mode == "1":
                data = CallbackData(site, b"fn", address, None, None, None, 0, None, correlation)
                c_callback(None, domain, cbid, ctypes.byref(data))
            else:
                cbdata = types.SimpleNamespace(
                    callback_site=site, correlation_id=correlation, function_params=address or 0
                )
                fake.callback(None, domain, cbid, cbdata)
