"""Layer ``staging`` (FC204): the torch adapter of `flashcheck.runtime.staging.StagingMonitor`.

While a per-step region is open it pushes a ``TorchDispatchMode`` that (1) tracks every ``non_blocking=True``
``copy_`` / ``_to_copy`` whose host side is pinned, holding the stream so the copy stays in flight at least
``hold_us`` after it is issued and recording an event after it, and (2) reports every host access of pinned
memory to the monitor: the tensors an op mutates (schema ``Tensor(a!)``) as writes, the host tensors it reads as
reads; view ops access nothing. A
``TorchFunctionMode`` adds ``Tensor.tolist`` and ``Tensor.numpy``, which read host memory without dispatching.
Copies issued while the stream captures a graph are not tracked (they are FC203's). Without CUDA the layer is
unavailable unless a `StreamOps` is injected (CPU tests use simulated pinned tensors and fake events).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from flashcheck.findings import Finding
from flashcheck.runtime.checks.staging import PINNED_STAGING_REUSED_IN_FLIGHT
from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.hooks.dispatch import residency
from flashcheck.runtime.monitor import RegionRecord
from flashcheck.runtime.stacks import capture_stack
from flashcheck.runtime.staging import Access, Direction, Span, StagingMonitor, Where

__all__ = ["DEFAULT_HOLD_US", "StagingHook", "StreamOps", "tensor_span"]

DEFAULT_HOLD_US = 3000.0
_MIN_HOLD_US = 5.0  # a top-up shorter than this is not worth a launch


class StreamOps(Protocol):
    """What the layer needs from the device (CUDA in production, a fake in CPU tests)."""

    def capturing(self) -> bool:
        """Whether the current stream is capturing a graph."""
        ...

    def mark(self) -> Callable[[], bool]:
        """Record an event on the current stream now; return its completion predicate (``event.query``)."""
        ...

    def hold(self, us: float) -> None:
        """Keep the current stream busy for about `us` microseconds (enqueued, returns at once)."""
        ...

    def stream(self) -> int:
        """An id of the current stream (holds are accounted per stream)."""
        ...


class _CudaStreamOps:
    def __init__(self) -> None:
        import importlib

        from flashcheck.pressure import cycles_per_us

        self._torch: Any = importlib.import_module("torch")
        cycles_per_us()  # calibrate now, outside every region (it synchronizes)

    def capturing(self) -> bool:
        return bool(self._torch.cuda.is_current_stream_capturing())

    def mark(self) -> Callable[[], bool]:
        ev = self._torch.cuda.Event()
        ev.record()
        query: Callable[[], bool] = ev.query
        return query

    def hold(self, us: float) -> None:
        from flashcheck.pressure import hold_stream

        hold_stream(us, self._torch)

    def stream(self) -> int:
        return int(self._torch.cuda.current_stream().cuda_stream)


def tensor_span(t: Any) -> Span | None:
    """The byte range a strided tensor's elements occupy (None for an empty tensor)."""
    n = t.numel()
    if n == 0:
        return None
    extent = 1 + sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))
    start = int(t.data_ptr())
    return Span(start, start + extent * t.element_size())


def _tensors(x: Any) -> Iterator[Any]:
    import torch

    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            if isinstance(y, torch.Tensor):
                yield y


class _Schema:
    """Per-op facts, cached: which positional/keyword arguments it writes, whether it is a pure view."""

    __slots__ = ("view", "write_names", "write_pos")

    def __init__(self, func: Any) -> None:
        s = func._schema
        self.write_pos = frozenset(
            i for i, a in enumerate(s.arguments) if a.alias_info is not None and a.alias_info.is_write
        )
        self.write_names = frozenset(s.arguments[i].name for i in self.write_pos)
        rets = s.returns
        self.view = (
            not self.write_pos
            and bool(rets)
            and all(r.alias_info is not None and not r.alias_info.is_write for r in rets)
        )


def _is_host(t: Any) -> bool:
    return residency(t) in ("pinned", "pageable")


class StagingHook(Hook):
    """Tracks pinned non_blocking copies and reports host accesses that race with them (FC204).

    Args:
        hold_us: every tracked copy stays in flight at least this long after it is issued (0: no delay): before
            each copy the stream is topped up with a device-side delay so that the work queued ahead of the copy
            lasts until ``hold_us`` after now (a lower bound: a delay never starts before it is enqueued), so a
            region of n copies costs about ``hold_us`` plus its host time, not n times ``hold_us``.
        ops: the device operations (default: CUDA); tests inject a fake.
        max_pending: bound on tracked copies (see `StagingMonitor`).
        clock: host time in seconds (tests inject one).
    """

    layer = "staging"
    folds = (PINNED_STAGING_REUSED_IN_FLIGHT.id,)

    def __init__(
        self,
        *,
        hold_us: float = DEFAULT_HOLD_US,
        ops: StreamOps | None = None,
        max_pending: int = 4096,
        clock: Callable[[], float] = time.perf_counter,
    ):
        super().__init__()
        self._clock = clock
        self.hold_us = hold_us
        self.monitor = StagingMonitor(max_pending=max_pending)
        self._ops_given = ops
        self._ops: StreamOps | None = ops
        self._modes: tuple[Any, Any] | None = None
        self._pushed_by: int | None = None
        self._where: list[tuple[int, Where]] = []
        self._schemas: dict[Any, _Schema] = {}
        self.tracked = 0  # copies tracked since install (diagnostics, overhead benchmarks)
        self.held_us = 0.0  # device-side delay enqueued since install
        self._busy_until: dict[int, float] = {}  # stream -> host time (s) before which its queue cannot drain

    def unavailable_reason(self) -> str | None:
        if self._ops_given is not None:
            return None
        import torch

        return None if torch.cuda.is_available() else "no CUDA device: pinned copies cannot be in flight here"

    def _install(self, sink: EventSink) -> None:
        if self._ops is None:
            self._ops = _CudaStreamOps()
        self._pushed_by = None
        self._where = []

    def _uninstall(self) -> None:
        self._pop()
        self._where = []

    # ---- regions -------------------------------------------------------------------------------------------------
    def region_enter(self, rec: RegionRecord, hot: bool) -> None:
        self._where.append((rec.id, Where(rec.name, rec.step, rec.step_name)))
        if self._pushed_by is None and hot and "capture" not in rec.names():
            dispatch, function = _make_modes(self)
            dispatch.__enter__()
            try:
                function.__enter__()
            except BaseException:
                dispatch.__exit__(None, None, None)
                raise
            self._modes, self._pushed_by = (dispatch, function), rec.id

    def watches(self, rec: RegionRecord) -> bool:
        return rec.hot is not None and "capture" not in rec.names()  # where `region_enter` pushes its modes

    def region_exit(self, rec: RegionRecord, hot: bool) -> None:
        if self._where and self._where[-1][0] == rec.id:
            self._where.pop()
        if self._pushed_by == rec.id:
            self._pop()

    def _pop(self) -> None:
        modes, self._modes, self._pushed_by = self._modes, None, None
        if modes is not None:
            dispatch, function = modes
            try:
                function.__exit__(None, None, None)
            finally:
                dispatch.__exit__(None, None, None)

    def findings(self) -> list[Finding]:
        return self.monitor.drain()

    # ---- observation ---------------------------------------------------------------------------------------------
    def _here(self) -> Where:
        return self._where[-1][1] if self._where else Where()

    def _quiet(self) -> bool:
        sink = self._sink
        return sink is None or sink.reading()

    def _schema(self, func: Any) -> _Schema:
        s = self._schemas.get(func)
        if s is None:
            s = self._schemas[func] = _Schema(func)
        return s

    def _access(self, kind: Access, t: Any, detail: str) -> None:
        span = tensor_span(t)
        if span is not None and self.monitor.conflicts(kind, span):
            self.monitor.access(kind, span, stack=capture_stack(4), detail=detail, where=self._here())

    def _before_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Report the host accesses of one aten op (only while copies are pending)."""
        if not self.monitor.has_pending or self._quiet():
            return
        s = self._schema(func)
        if s.view:
            return
        name = func._schema.name
        if name in ("aten::copy_", "aten::_to_copy") and not all(
            _is_host(t) for t in (*_tensors(args[:2]), *_tensors(kwargs.get("src")))
        ):
            return  # a copy that involves the device is stream-ordered after the pending copies: no host access
        detail = name.replace("::", ".")
        for i, a in enumerate(args):
            for t in _tensors(a):
                if _is_host(t):
                    self._access("write" if i in s.write_pos else "read", t, detail)
        for k, v in kwargs.items():
            for t in _tensors(v):
                if _is_host(t):
                    self._access("write" if k in s.write_names else "read", t, detail)

    def _copy_kind(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Direction, Any | None, str] | None:
        """(direction, pinned host tensor or None for the output, detail) of a tracked non_blocking copy."""
        if name == "aten::copy_" and len(args) >= 2:
            nb = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if not nb:
                return None
            dst, src = residency(args[0]), residency(args[1])
            if dst == "device" and src == "pinned":
                return "h2d", args[1], "aten.copy_(device <- pinned, non_blocking=True)"
            if dst == "pinned" and src == "device":
                return "d2h", args[0], "aten.copy_(pinned <- device, non_blocking=True)"
            return None
        if name == "aten::_to_copy" and args and kwargs.get("non_blocking"):
            src, dev = residency(args[0]), kwargs.get("device")
            to_host = dev is not None and str(dev).startswith("cpu")
            if src == "pinned" and dev is not None and not to_host and not str(dev).startswith("meta"):
                return "h2d", args[0], "aten._to_copy(pinned -> device, non_blocking=True)"
            if src == "device" and to_host:
                return "d2h", None, "aten._to_copy(device -> pinned, non_blocking=True)"
        return None

    def _call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            self._before_op(func, args, kwargs)
            name = func._schema.name
            hit = None
            if name in ("aten::copy_", "aten::_to_copy") and not self._quiet():
                ops = self._ops
                hit = self._copy_kind(name, args, kwargs)
                if hit is not None and ops is not None and ops.capturing():
                    hit = None
        except Exception as exc:
            self._error(exc)
            return func(*args, **kwargs)
        if hit is None:
            return func(*args, **kwargs)
        ops = self._ops
        assert ops is not None
        if self.hold_us > 0:
            self._top_up(ops)
        out = func(*args, **kwargs)
        try:
            direction, host, detail = hit
            host = out if host is None else host
            span = tensor_span(host) if residency(host) == "pinned" else None
            if span is not None:
                self.monitor.copy(
                    direction, span, done=ops.mark(), stack=capture_stack(4), detail=detail, where=self._here()
                )
                self.tracked += 1
        except Exception as exc:
            self._error(exc)
        return out

    def _top_up(self, ops: StreamOps) -> None:
        """Delay the stream so that the copy about to be issued cannot complete before ``hold_us`` from now."""
        key, now = ops.stream(), self._clock()
        # the delay already queued ahead is credited at half its estimated length: GPU clocks vary with load (a
        # calibration on an idle GPU overestimates how long a sleep lasts on a busy one), and an underestimate
        # only costs device time while an overestimate lets a copy complete before the host's racing access
        need = self.hold_us - max(self._busy_until.get(key, 0.0) - now, 0.0) * 1e6 / 2
        if need >= _MIN_HOLD_US:
            ops.hold(need)
            self.held_us += need
            self._busy_until[key] = now + self.hold_us / 1e6

    def _host_read(self, t: Any, what: str) -> None:
        try:
            if self.monitor.has_pending and not self._quiet() and _is_host(t):
                self._access("read", t, what)
        except Exception as exc:
            self._error(exc)


def _make_modes(hook: StagingHook) -> tuple[Any, Any]:
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = {torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.numpy: "Tensor.numpy"}

    class _StagingDispatch(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            return hook._call(func, args, kwargs or {})

    class _StagingFunction(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
            what = reads.get(func)
            if what is not None and args:
                hook._host_read(args[0], what)
            return func(*args, **(kwargs or {}))

    return _StagingDispatch(), _StagingFunction()  # type: ignore[no-untyped-call]
