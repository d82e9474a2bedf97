"""Thin torch adapters that feed the monitor; `build_hooks` picks them by layer selection.

``layers="cheap"``: ``sync_debug``, ``gpu_trace``, ``graph_replay``, and ``dispatch`` scoped to capture regions (a
capture happens once, so it costs nothing per step): nothing in them runs per kernel or per operator, and a region
costs a few microseconds. ``layers="all"``: the same plus ``cupti`` (CUPTI callbacks, filtered in C: blocking CUDA
calls made anywhere, C++ extensions included, and device-to-host or pageable host-to-device ``cudaMemcpyAsync``
copies, each with its Python stack), which enters Python only for those and costs a C call per pinned copy:
together they see every kind of per-step event the checker knows. ``layers="races"``: ``all`` plus ``staging``
(pinned copies in flight, FC204; it holds the stream so that each copy stays in flight, which makes races show on
every run and costs about ``hold_us`` of device time per region). Two layers are second witnesses of
what those already see, at a price per region, and run only when named in a list: ``alloc_stats`` (allocator counters
read around each hot region, about 25 µs a read; ``gpu_trace`` reports each allocation with its stack) and
``dispatch`` in hot regions too (every aten op of a hot region through a Python dispatch mode, tens of µs a region; a
named ``dispatch`` has the scope ``hot+capture``). Layers that cannot run here (no CUDA device, no ``cupti-python``)
are skipped and reported by the checker, never silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from flashcheck.errors import InvalidArgument
from flashcheck.runtime.hooks.base import EventSink, Hook, HookError

if TYPE_CHECKING:
    from flashcheck.runtime.hooks.dispatch import Scope

__all__ = [
    "ALL",
    "CHEAP",
    "LAYER_NAMES",
    "PRESETS",
    "RACES",
    "EventSink",
    "Hook",
    "HookError",
    "LayerName",
    "LayerSpec",
    "build_hooks",
]

LayerName = Literal["sync_debug", "dispatch", "gpu_trace", "cupti", "alloc_stats", "graph_replay", "staging"]
LAYER_NAMES: tuple[LayerName, ...] = (
    "sync_debug",
    "dispatch",
    "gpu_trace",
    "cupti",
    "alloc_stats",
    "graph_replay",
    "staging",
)
CHEAP: tuple[LayerName, ...] = ("sync_debug", "gpu_trace", "graph_replay", "dispatch")
ALL: tuple[LayerName, ...] = (*CHEAP, "cupti")
# staging installs before cupti: it calibrates its device delay (a synchronize) on install, outside every region
RACES: tuple[LayerName, ...] = (*CHEAP, "staging", "cupti")
PRESETS: dict[str, tuple[LayerName, ...]] = {"cheap": CHEAP, "all": ALL, "races": RACES}
LayerSpec = Literal["cheap", "all", "races"] | Sequence["LayerName | Hook"]


def build_hooks(layers: LayerSpec, *, device: Any = None) -> list[Hook]:
    """Hook instances for a layer selection (names or ready-made hooks, which tests use to inject fakes)."""
    if isinstance(layers, str):
        if layers not in PRESETS:
            raise InvalidArgument(
                f"layers={layers!r}: use 'cheap', 'all', 'races' or a list of {', '.join(LAYER_NAMES)}"
            )
        names: list[LayerName | Hook] = list(PRESETS[layers])
        scope: Scope = "capture"  # CUPTI sees what dispatch would see in hot regions without a Python call per op
        # ... and where CUPTI cannot run (no device, no cupti-python), dispatch watches hot regions instead
        stand_in = frozenset({"cupti"}) if "cupti" in names else frozenset()
    else:
        names = list(layers)
        scope, stand_in = "hot+capture", frozenset()
    out: list[Hook] = []
    for n in names:
        if isinstance(n, Hook):
            out.append(n)
        elif n == "sync_debug":
            from flashcheck.runtime.hooks.sync_debug import SyncDebugHook

            out.append(SyncDebugHook())
        elif n == "dispatch":
            from flashcheck.runtime.hooks.dispatch import DispatchHook

            out.append(DispatchHook(scope, hot_without=stand_in))
        elif n == "gpu_trace":
            from flashcheck.runtime.hooks.gpu_trace import GpuTraceHook

            out.append(GpuTraceHook())
        elif n == "cupti":
            from flashcheck.runtime.hooks.cupti import CuptiHook

            out.append(CuptiHook())
        elif n == "alloc_stats":
            from flashcheck.runtime.hooks.alloc_stats import AllocStatsHook

            out.append(AllocStatsHook(device))
        elif n == "graph_replay":
            from flashcheck.runtime.hooks.graph_replay import GraphReplayHook

            out.append(GraphReplayHook())
        elif n == "staging":
            from flashcheck.runtime.hooks.staging import StagingHook

            out.append(StagingHook())
        else:
            raise InvalidArgument(f"unknown detection layer {n!r}; known: {', '.join(LAYER_NAMES)}")
    layers_seen = [h.layer for h in out]
    dup = {x for x in layers_seen if layers_seen.count(x) > 1}
    if dup:
        raise InvalidArgument(f"detection layer(s) {', '.join(sorted(dup))} selected twice")
    return out
