"""Start-up memory profiling and KV cache sizing.

The engine profiles one forward pass at its largest batch, reads what the caching allocator and the driver report,
and turns what is left of the memory budget into KV pages, FlashInfer workspaces and a graph budget.
"""

from memprof.kv_pool import PagedKVPool
from memprof.limits import EngineLimits, KVSizing, WorkspaceSizes
from memprof.profiler import MemoryProfiler
from memprof.workspaces import WorkspacePlanner, WorkspaceSet

__all__ = [
    "EngineLimits",
    "KVSizing",
    "MemoryProfiler",
    "PagedKVPool",
    "WorkspacePlanner",
    "WorkspaceSet",
    "WorkspaceSizes",
]
