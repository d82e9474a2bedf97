"""Layer ``dispatch``: a ``TorchDispatchMode`` that names the aten ops that sync or copy, with Python stacks.

Catches, for tensors on the device: ``aten._local_scalar_dense`` (``.item()``, ``bool()``, ``int()``), ``_to_copy``
and ``copy_`` between host and device (``.cpu()``, ``.to()``, ``.tolist()``, with the host side's memory kind:
pinned or pageable), and the data-dependent-shape ops that sync (``nonzero``, boolean-mask ``index``,
``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``). Misses (measured on an H100):
everything that does not dispatch: ``torch.cuda.synchronize``, event and stream syncs, FlashInfer kernels and the
syncs inside its C++ code. Cost: about +5.6 µs per op while active, so it is pushed only where it matters: in
capture regions while a ``torch.cuda.CUDAGraph`` captures (its ``capture_begin`` to its ``capture_end``: only work
issued then becomes a graph node, and this is how a pinned copy captured into a graph, FC203, is seen; the plan and
warm-up runs around it run eagerly and unwatched by this layer; on a machine that cannot capture, the whole capture
region, for simulated device tensors), and in hot regions when named in a layer list (``layers=[..., "dispatch"]``)
or when the ``cupti`` layer of a preset cannot run here (no device, no ``cupti-python``): CUPTI sees the same copies
and syncs in hot regions without a Python call per op. The mode stays outside torch's compiler wrapper while no
compiler is loaded in the process (`_make_mode`): the wrapper's first call imports it, about 2 s in every process.

A tensor whose class has ``_flashcheck_residency = "device"`` or ``"pinned"`` is treated as living there: this is how
CPU CI simulates device tensors (`flashcheck.runtime.simdevice`), so a broken detector fails without a GPU.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Mapping
from typing import Any, Literal

from flashcheck.runtime.hooks._patch import MethodPatch
from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event, EventKind, Memory, RegionRecord
from flashcheck.runtime.stacks import capture_stack

__all__ = ["DispatchHook", "Scope", "residency"]

Scope = Literal["capture", "hot+capture"]
Residency = Literal["device", "pinned", "pageable"]

_SYNC_OPS = frozenset(
    {
        "aten::nonzero",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::is_nonzero",
        "aten::equal",
    }
)


def residency(t: Any) -> Residency | None:
    """Where a tensor's data lives: ``device``, ``pinned`` host, ``pageable`` host; None for non-tensors/meta."""
    import torch

    if not isinstance(t, torch.Tensor):
        return None
    sim = getattr(type(t), "_flashcheck_residency", None)
    if sim in ("device", "pinned"):
        return sim  # type: ignore[no-any-return]
    dev = t.device.type
    if dev == "meta":
        return None
    if dev != "cpu":
        return "device"
    try:
        return "pinned" if t.is_pinned() else "pageable"
    except RuntimeError:  # no accelerator runtime to ask: it cannot be pinned
        return "pageable"


def _host_memory(r: Residency | None) -> Memory:
    return "pinned" if r == "pinned" else "pageable"


def classify(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[EventKind, Memory, str] | None:
    """(event kind, host memory kind, detail) for one aten call, or None when it neither syncs nor copies."""
    if op == "aten::_local_scalar_dense":
        if args and residency(args[0]) == "device":
            return "d2h_copy", "pageable", "aten._local_scalar_dense (.item(), bool(), int() of a device tensor)"
        return None
    if op == "aten::_to_copy":
        if not args:
            return None
        src = residency(args[0])
        dst_dev = kwargs.get("device")
        if src == "device" and dst_dev is not None and str(dst_dev).startswith("cpu"):
            mem: Memory = "pinned" if kwargs.get("pin_memory") else "pageable"
            return "d2h_copy", mem, "aten._to_copy to CPU (.cpu(), .to('cpu'), .tolist(), .numpy())"
        if src in ("pinned", "pageable") and dst_dev is not None and not str(dst_dev).startswith(("cpu", "meta")):
            return "h2d_copy", _host_memory(src), f"aten._to_copy from {src} host memory to the device"
        return None
    if op == "aten::copy_":
        if len(args) < 2:
            return None
        dst, src = residency(args[0]), residency(args[1])
        if src == "device" and dst in ("pinned", "pageable"):
            return "d2h_copy", _host_memory(dst), f"aten.copy_ from the device into {dst} host memory"
        if dst == "device" and src in ("pinned", "pageable"):
            return "h2d_copy", _host_memory(src), f"aten.copy_ from {src} host memory to the device"
        return None
    if op in _SYNC_OPS or (op == "aten::repeat_interleave" and kwargs.get("output_size") is None):
        if args and residency(args[0]) == "device":
            return "sync", "unknown", f"{op.replace('::', '.')} (data-dependent output size)"
        return None
    if op == "aten::index" and len(args) > 1 and args[0] is not None and residency(args[0]) == "device":
        for ix in args[1] or ():
            if getattr(ix, "dtype", None) is not None and str(ix.dtype) in ("torch.bool", "torch.uint8"):
                return "sync", "unknown", "aten.index with a boolean mask (data-dependent output size)"
    return None


_CAPTURE_ONLY = frozenset({"capture"})
_WATCHED = frozenset(
    {"aten::_local_scalar_dense", "aten::_to_copy", "aten::copy_", "aten::index", "aten::repeat_interleave", *_SYNC_OPS}
)


_AT_CAPTURE = -1  # `DispatchHook._pushed_by` when a graph's capture pushed the mode (region ids are >= 0)
_MODE_CLASS: dict[bool, Any] = {}  # the dispatch-mode classes, built once each (building one costs ~60 µs)


def _compiling() -> bool:
    """Whether torch's compiler is loaded in this process: only then can a frame of ours be traced by it."""
    return "torch._dynamo" in sys.modules


def _make_mode(hook: DispatchHook) -> Any:
    """A dispatch mode for `hook`. Torch wraps a mode's ``__torch_dispatch__`` so that its compiler never traces it,
    and that wrapper's first call imports the compiler (about 2 s, in every process that pushes a mode). Nothing can
    be traced before the compiler is loaded (``torch.compile`` loads it), so until then the mode is left unwrapped;
    a mode pushed once the compiler is loaded is wrapped as torch wraps it."""
    wrapped = _compiling()
    if wrapped not in _MODE_CLASS:
        _MODE_CLASS[wrapped] = _mode_class(wrapped)
    return _MODE_CLASS[wrapped](hook)


def _mode_class(wrapped: bool) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class _FlashcheckMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        @classmethod
        def _should_skip_dynamo(cls) -> bool:  # read when the class is made, by the torch versions that wrap
            return wrapped

        def __init__(self, owner: DispatchHook) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.owner = owner

        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = func._schema.name
            if name in _WATCHED:
                self.owner._observe(name, args, kwargs)  # before the call: a capture error must not hide it
            return func(*args, **kwargs)

    return _FlashcheckMode


class DispatchHook(Hook):
    """Pushes a dispatch mode while a watched region is open (see the module docstring for the scope)."""

    layer = "dispatch"
    reports = (
        Event("sync", "dispatch"),
        *(Event(k, "dispatch", memory=m) for k in ("d2h_copy", "h2d_copy") for m in ("pageable", "pinned")),
    )

    def __init__(
        self,
        scope: Scope = "hot+capture",
        *,
        hot_without: frozenset[str] = frozenset(),
        graph_owner: Any = None,
        at_stream_capture: bool | None = None,
    ) -> None:
        super().__init__()
        self.scope: Scope = scope
        self._base_scope: Scope = scope
        self._hot_without = hot_without
        self._mode: Any = None
        self._pushed_by: int | None = None
        # capture regions push the mode only while a graph of `graph_owner` (``torch.cuda.CUDAGraph``) captures in
        # them: None = where CUDA can capture (a simulated device pushes it for the whole region)
        self._graph_owner = graph_owner
        self._at_stream_capture = at_stream_capture
        self._deferred: dict[int, int] = {}  # open capture regions waiting for a stream capture: id -> thread
        self._capture: tuple[int, int] | None = None  # (graph, thread) of the capture that pushed the mode
        self._begin, self._end = MethodPatch("capture_begin"), MethodPatch("capture_end")

    def _install(self, sink: EventSink) -> None:
        self._pushed_by, self._capture = None, None
        self._deferred.clear()
        _warm_up()
        if self._at_stream_capture is None:
            self._at_stream_capture = _stream_capturing() is not None
        if self._at_stream_capture:
            self._wrap_capture()

    def _uninstall(self) -> None:
        self._pop()
        self._deferred.clear()
        self._begin.restore()
        self._end.restore()
        self.scope = self._base_scope

    def layers_skipped(self, skipped: Mapping[str, str]) -> None:
        """Watch hot regions too when a layer it stands in for cannot run here (``hot_without``): the presets
        leave hot regions to CUPTI, and without it (no device, no cupti-python) only this layer sees a per-step
        copy or sync of a simulated device tensor, or a pageable ``non_blocking`` copy."""
        if self._hot_without & skipped.keys():
            self.scope = "hot+capture"

    def region_names(self) -> frozenset[str] | None:
        return _CAPTURE_ONLY if self.scope == "capture" else None

    def _wants(self, rec: RegionRecord, hot: bool) -> bool:
        return "capture" in rec.names() or (hot and self.scope == "hot+capture")

    def watches(self, rec: RegionRecord) -> bool:
        return self._wants(rec, rec.hot is not None)

    def region_enter(self, rec: RegionRecord, hot: bool) -> None:
        if self._pushed_by is not None or not self._wants(rec, hot):
            return
        if self._at_stream_capture and not (hot and self.scope == "hot+capture") and not _stream_capturing():
            # only work issued while the stream captures can become a graph node (FC203); the plan and warm-up a
            # capture region runs around it execute eagerly and dispatch no faster under a mode (a region opened
            # while a capture is under way is watched at once)
            self._deferred[rec.id] = rec.thread
            return
        self._push(rec.id)

    def region_exit(self, rec: RegionRecord, hot: bool) -> None:
        self._deferred.pop(rec.id, None)
        me = threading.get_ident()
        if self._pushed_by == rec.id or (
            self._capture is not None and self._capture[1] == me and me not in self._deferred.values()
        ):
            self._pop()  # its region ended (a capture that never reached capture_end included)

    def _push(self, by: int) -> None:
        mode = _make_mode(self)
        mode.__enter__()
        self._mode, self._pushed_by = mode, by

    def _pop(self) -> None:
        mode, self._mode, self._pushed_by, self._capture = self._mode, None, None, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def _wrap_capture(self) -> None:
        """Push the mode when a graph starts capturing inside a watched capture region; pop it when it ends."""
        owner = self._graph_owner
        if owner is None:
            import torch

            owner = torch.cuda.CUDAGraph
        hook = self

        def make_begin(prev: Any) -> Any:
            @functools.wraps(prev)
            def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
                out = prev(graph, *args, **kwargs)
                me = threading.get_ident()
                if hook._begin.wrapper is not None and hook._pushed_by is None and me in hook._deferred.values():
                    try:  # a capture region of this thread is open: watch what the capture records
                        hook._push(_AT_CAPTURE)
                        hook._capture = (id(graph), me)
                    except Exception as exc:  # the capture goes on; the layer reports its own failure
                        hook._error(exc)
                return out

            return capture_begin

        def make_end(prev: Any) -> Any:
            @functools.wraps(prev)
            def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
                if hook._capture is not None and hook._capture[0] == id(graph):
                    hook._pop()
                return prev(graph, *args, **kwargs)

            return capture_end

        self._begin.apply(owner, make_begin)
        self._end.apply(owner, make_end)

    def _observe(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            sink = self._sink
            if sink is None or sink.reading():
                return
            hit = classify(name, args, kwargs)
            if hit is None:
                return
            kind, memory, detail = hit
            capturing = _stream_capturing()
            if kind == "h2d_copy" and memory == "pinned" and capturing is False:
                return  # harmless outside graph capture (the monitor drops it): skip the costly stack walk
            self._emit(
                Event(
                    kind,
                    "dispatch",
                    capture_stack(3),
                    detail,
                    memory=memory,
                    thread=threading.get_ident(),
                    capturing=capturing,
                )
            )
        except Exception as exc:
            self._error(exc)


def _warm_up() -> None:
    """Dispatch one op under this layer's mode, outside every region: the first op under a dispatch mode may import
    torch modules lazily (with the compiler loaded, the wrapper torch puts around a mode imports more of it), which
    must neither cost a watched step its time nor fail inside the target's region and be blamed on it."""
    import torch

    with _make_mode(DispatchHook()):  # a hook with no sink: it reports nothing
        torch.zeros(1).add_(1)


def _stream_capturing() -> bool | None:
    """Whether the current CUDA stream is capturing a graph; None where CUDA is absent (simulated-device tests)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return bool(torch.cuda.is_current_stream_capturing())  # pragma: no mutate (CUDA only)
