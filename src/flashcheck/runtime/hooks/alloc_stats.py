"""Layer ``alloc_stats``: the caching allocator's counters, read when the outermost hot region opens and closes.

Catches every device allocation made through torch's caching allocator inside a hot region (the allocation count
grows) and pool growth (new segments reserved, ``reserved_bytes`` grows), whoever made it: Python or a C++ extension
using torch's allocator. Misses: allocations made with raw CUDA APIs (``cudaMalloc`` in C++), and it has no stack
(the ``gpu_trace`` layer gives one per allocation). Cost: two reads of the allocator statistics per step
(``torch.cuda.memory_stats_as_nested_dict``, no flattening). Allocations the checker makes inside ``checker_read``
are subtracted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flashcheck.runtime.hooks.base import EventSink, Hook
from flashcheck.runtime.monitor import Event, RegionRecord

__all__ = ["AllocStats", "AllocStatsHook"]

AllocStats = tuple[int, int, int]  # (allocations made so far, segments allocated so far, bytes reserved now)


def _torch_reader(device: Any) -> Callable[[], AllocStats]:
    import torch

    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())

    def read() -> AllocStats:
        s = torch.cuda.memory_stats_as_nested_dict(dev)
        return (
            int(s["allocation"]["all"]["allocated"]),
            int(s["segment"]["all"]["allocated"]),
            int(s["reserved_bytes"]["all"]["current"]),
        )

    return read


class AllocStatsHook(Hook):
    """Compares allocator counters across each outermost hot region.

    Args:
        device: the CUDA device whose allocator is read (default: the current one).
        read_stats: returns ``(allocation count, segment count, reserved bytes)``; tests pass fakes.
    """

    layer = "alloc_stats"
    reports = (Event("alloc", "alloc_stats"), Event("pool_growth", "alloc_stats"))

    def __init__(
        self,
        device: Any = None,
        *,
        read_stats: Callable[[], AllocStats] | None = None,
        available: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__()
        self._device = device
        self._read = read_stats
        self._available = available
        self._depth = 0
        self._start: AllocStats | None = None
        self._outer: RegionRecord | None = None
        self._read_start: AllocStats | None = None
        self._excluded = [0, 0, 0]

    def unavailable_reason(self) -> str | None:
        if self._available is not None:
            return None if self._available() else "no CUDA device"
        import torch

        return None if torch.cuda.is_available() else "no CUDA device (no caching-allocator statistics)"

    def _install(self, sink: EventSink) -> None:
        if self._read is None:
            self._read = _torch_reader(self._device)
        self._depth = 0

    def _uninstall(self) -> None:
        self._depth, self._start, self._outer, self._read_start = 0, None, None, None

    def _stats(self) -> AllocStats:
        assert self._read is not None
        return self._read()

    def region_enter(self, rec: RegionRecord, hot: bool) -> None:
        if not hot:
            return
        if self._depth == 0:
            self._start, self._outer, self._excluded = self._stats(), rec, [0, 0, 0]
        self._depth += 1

    def region_exit(self, rec: RegionRecord, hot: bool) -> None:
        if not hot or self._depth == 0:
            return
        self._depth -= 1
        if self._depth or self._start is None or self._outer is None:
            return
        try:
            end = self._stats()
            allocs, segs, reserved = (end[i] - self._start[i] - self._excluded[i] for i in range(3))
            rid = self._outer.id
            if allocs > 0:
                self._emit(
                    Event(
                        "alloc",
                        "alloc_stats",
                        (),
                        f"{allocs} allocation(s) counted by the caching allocator",
                        count=allocs,
                        region_id=rid,
                    )
                )
            if segs > 0 or reserved > 0:
                self._emit(
                    Event(
                        "pool_growth",
                        "alloc_stats",
                        (),
                        f"{segs} new segment(s), {max(reserved, 0):,} more bytes reserved",
                        nbytes=max(reserved, 0),
                        region_id=rid,
                    )
                )
        except Exception as exc:
            self._error(exc)
        finally:
            self._start, self._outer = None, None

    def read_begin(self) -> None:
        if self._depth:
            self._read_start = self._stats()

    def read_end(self) -> None:
        if self._depth and self._read_start is not None:
            end = self._stats()
            for i in range(3):
                self._excluded[i] += end[i] - self._read_start[i]
            self._read_start = None
