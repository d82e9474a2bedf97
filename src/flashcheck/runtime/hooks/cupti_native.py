"""The cupti layer's C filter (``cupti_filter.c``): CUPTI calls a C function, which answers the common calls itself
and enters Python only for the ones the layer may report.

Through ``cupti-python`` alone, every watched call costs two Python calls (CUPTI calls back as it enters and as it
returns), and an engine makes a ``cudaMemcpyAsync`` from pinned memory every step. The filter answers those in C
(the exit of every call, the driver call inside a runtime call already seen, a host-to-device copy from pinned memory,
a copy with neither side on the host), and hands blocking calls, device-to-host copies and pageable or unclassified
copies to `CuptiBindings`'s logic in Python, on the calling thread, with the Python stack intact.

It is compiled on first use with the machine's C compiler (``$CC``, else ``cc``; a GPU node that builds FlashInfer's
kernels has one) into ``$FLASHCHECK_CACHE_DIR`` (default ``$XDG_CACHE_HOME/flashcheck``, else
``~/.cache/flashcheck``, created 0700), once per source, compiler command and platform; a build that another user
owns or may write is never loaded. Where it cannot be built or loaded (two libcupti libraries in the process
included), or with ``FLASHCHECK_CUPTI_FILTER=0``, the layer runs on ``cupti-python``'s Python callbacks (same
findings, higher cost) and `CuptiHook.backend_note` says why.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import platform
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from types import CodeType
from typing import Any

from flashcheck._files import check_output_path
from flashcheck.errors import InvalidArgument
from flashcheck.runtime.hooks.cupti import Call, CuptiBindings, FilterUnavailable

__all__ = ["SOURCE", "CuptiNative", "build_filter", "cache_dir", "load_filter"]

SOURCE = Path(__file__).with_name("cupti_filter.c")
_WHAT: dict[Call, int] = {"sync": 1, "copy": 2}
_FLAGS = ("-std=gnu11", "-O2", "-shared", "-fPIC")
# The one forwarding function the C filter calls: it lives as long as the process (a CUPTI callback in flight on
# another thread may still call it after a checker closed), and dispatches to the backend started last.
_FORWARD_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)
_STARTED: list[CuptiNative] = []


def _forward(domain: int, cbid: int, correlation: int, params: int | None) -> None:
    for backend in _STARTED[-1:]:  # a slice: another thread may close the backend meanwhile
        backend._forwarded(domain, cbid, correlation, params or 0)


_FORWARD = _FORWARD_TYPE(_forward)


@atexit.register
def _stop_all() -> None:
    """At exit, a filter still subscribed (a checker never closed) stops calling into an interpreter going away."""
    for backend in list(_STARTED):
        if backend._lib is not None:
            backend._lib.fc_stop()


def cache_dir() -> Path:
    """Where compiled filters are kept."""
    env = os.environ.get("FLASHCHECK_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "flashcheck"


def build_filter(directory: Path | None = None, *, compiler: str | None = None) -> Path | str:
    """The path of the compiled filter (built now unless an identical build is cached), or why it cannot be: every
    failure is a reason, never an exception (the layer then runs on Python callbacks)."""
    cc = compiler or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler (set $CC or install cc) to build the cupti layer's C filter"
    try:
        directory = directory or cache_dir()
        command = [*shlex.split(cc), *_FLAGS]
        # one build per compiler command and platform: a cache shared between machines (a home directory on NFS)
        parts = (SOURCE.read_bytes(), " ".join(command).encode(), platform.machine().encode(), sys.platform.encode())
        key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
        target = directory / f"cupti_filter-{key}.so"
        if check_output_path(target) is not None:
            return target if _trusted(target) else f"{target} is not this user's alone (owner or write permission)"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except (OSError, RuntimeError, ValueError, InvalidArgument) as exc:  # RuntimeError: no home directory
        return f"cannot keep the cupti layer's C filter in {directory or 'a cache directory'}: {exc}"
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".cupti_filter-", suffix=".so", dir=directory)
        os.close(fd)
        proc = subprocess.run(
            [*command, "-o", tmp, str(SOURCE)], capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            why = next((ln for ln in lines if "error" in ln), lines[0] if lines else f"exit status {proc.returncode}")
            return f"{cc} could not build the cupti layer's C filter: {why.strip()}"
        with open(tmp, "rb") as fh:  # on disk before it is renamed: a crash never leaves a truncated build
            os.fsync(fh.fileno())
        check_output_path(target)  # something other than a regular file appeared meanwhile: never replaced
        os.replace(tmp, target)
        return target if _trusted(target) else f"{directory} may be written by others: the filter is not loaded"
    except InvalidArgument as exc:
        return f"the cupti layer's C filter is not kept: {exc}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{cc} could not build the cupti layer's C filter in {directory}: {exc}"
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def _trusted(path: Path) -> bool:
    """A cached build is loaded only when this user owns it and its directory and nobody else may write to them
    (a shared cache directory must not run another user's code in this process)."""
    uid = os.getuid()
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid != uid or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True


def load_filter(path: Path) -> Any:
    """The compiled filter, loaded, with its functions' signatures declared."""
    lib = ctypes.CDLL(str(path))
    lib.fc_set_call.argtypes = (ctypes.c_int, ctypes.c_uint32, ctypes.c_int)
    lib.fc_set_call.restype = None
    lib.fc_reset.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
    lib.fc_reset.restype = None
    lib.fc_stop.argtypes = ()
    lib.fc_stop.restype = None
    lib.fc_callback.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p)
    lib.fc_callback.restype = None
    for name in ("fc_forwarded", "fc_answered"):
        getattr(lib, name).argtypes = ()
        getattr(lib, name).restype = ctypes.c_uint64
    return lib


def _loaded_libcupti() -> Any:
    """The libcupti that ``cupti-python`` loaded, found in the process's maps: the only one, since the filter must
    subscribe to the library whose callback ids the layer enabled (with two loaded, say a CUDA 12 torch's and
    cupti-python's, the layer runs on Python callbacks)."""
    with open("/proc/self/maps") as maps:
        paths = sorted({ln.split(maxsplit=5)[-1].strip() for ln in maps if "/libcupti.so" in ln})
    if len(paths) != 1:
        listed = f": {', '.join(paths)}" if paths else ""
        raise OSError(f"{len(paths)} libcupti libraries are loaded in this process{listed}")
    return ctypes.CDLL(paths[0])


class CuptiNative(CuptiBindings):
    """`CuptiBindings` with the C filter as CUPTI's subscriber: the same calls enabled, the same logic for the calls
    it forwards, no Python call for the ones it answers."""

    def __init__(self, filter_path: Path) -> None:
        super().__init__()
        self._filter_path = filter_path
        self._lib: Any = None
        self._libcupti: Any = None

    @property
    def callback_code(self) -> CodeType:
        return _forward.__code__

    def _subscribe(self, cupti: Any) -> int:
        try:
            self._lib = load_filter(self._filter_path)
            self._libcupti = lib = _loaded_libcupti()
            lib.cuptiSubscribe.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p)
            lib.cuptiEnableCallback.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32)
            lib.cuptiUnsubscribe.argtypes = (ctypes.c_void_p,)
        except (OSError, AttributeError) as exc:
            raise FilterUnavailable(f"the C filter does not load: {exc}") from None
        handle = ctypes.c_void_p()
        err = lib.cuptiSubscribe(ctypes.byref(handle), ctypes.cast(self._lib.fc_callback, ctypes.c_void_p), None)
        if err != 0:
            raise RuntimeError(f"cuptiSubscribe returned CUptiResult {err}")
        return int(handle.value or 0)

    def _enable(self, cupti: Any, domain: int, cbid: int, what: Call) -> None:
        self._lib.fc_set_call(domain, cbid, _WHAT[what])
        err = self._libcupti.cuptiEnableCallback(1, self._subscriber, domain, cbid)
        if err != 0:
            raise RuntimeError(f"cuptiEnableCallback returned CUptiResult {err}")

    def _begin(self) -> None:
        libcuda = self._cuda()
        get_attribute = ctypes.cast(libcuda.cuPointerGetAttribute, ctypes.c_void_p)
        self._lib.fc_reset(ctypes.cast(_FORWARD, ctypes.c_void_p), get_attribute)
        _STARTED.append(self)

    def counts(self) -> tuple[int, int]:
        """(calls forwarded to Python, calls answered in C) since the last start."""
        lib = self._lib
        return (int(lib.fc_forwarded()), int(lib.fc_answered())) if lib is not None else (0, 0)

    def _forwarded(self, domain: int, cbid: int, correlation: int, params: int) -> None:
        on_call = self._on_call
        hit = self._calls.get((domain, cbid))
        if on_call is not None and hit is not None:
            on_call(hit[0], hit[1], correlation, params)

    def _unsubscribe(self, cupti: Any) -> None:
        if self._lib is not None:
            self._lib.fc_stop()
        if self in _STARTED:
            _STARTED.remove(self)
        if self._libcupti is not None and self._subscriber is not None:
            self._libcupti.cuptiUnsubscribe(self._subscriber)
