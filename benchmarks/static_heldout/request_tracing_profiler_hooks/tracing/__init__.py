"""Per-step tracing: NVTX-like ranges, tensor statistics, a sampling kernel profiler, hook registry."""
from tracing.profiler import SamplingProfiler
from tracing.ranges import TraceRange, nvtx_range
from tracing.registry import HOOKS, TraceHook, due_hooks, register_hook
from tracing.stats import TensorStatsCollector

__all__ = [
    "SamplingProfiler",
    "TraceRange",
    "nvtx_range",
    "HOOKS",
    "TraceHook",
    "due_hooks",
    "register_hook",
    "TensorStatsCollector",
]
