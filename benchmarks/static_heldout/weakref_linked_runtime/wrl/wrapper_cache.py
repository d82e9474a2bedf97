"""Graph-mode decode wrappers by padded batch size.

The cache does not own its wrappers: each captured graph entry (graph_runner.GraphEntry) holds
its wrapper strongly, and the cache keeps them in a ``WeakValueDictionary``. Dropping a graph
(re-capture after a weight update, sleep mode) drops its wrapper and the wrapper's slot here, so
nothing can plan a wrapper whose graph no longer exists.
"""

from __future__ import annotations

import logging
import weakref
from typing import Optional

from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from wrl.buffers import GraphBufferPool, WorkspaceArena
from wrl.config import EngineConfig

logger = logging.getLogger(__name__)


class PlanRecord:
    """What the engine last planned for one graph batch size. Kept by the engine itself so that
    nothing has to look inside the wrapper to know whether it was planned."""

    __slots__ = ("bs", "num_pages", "_plan_info")

    def __init__(self, bs: int):
        self.bs = bs
        self.num_pages = -1
        self._plan_info: Optional[tuple[int, int]] = None

    def remember(self, raw_bs: int, num_pages: int) -> None:
        self.num_pages = num_pages
        self._plan_info = (raw_bs, num_pages)  # ok: FC103


def _force_eager(wrapper: BatchDecodeWithPagedKVCacheWrapper) -> None:
    # debugging aid: let a graph wrapper be run eagerly on arbitrary buffers while
    # graphs are disabled at run time (``/debug/disable_graphs``)
    setattr(wrapper, "_use_cuda_graph", False)  # expect: FC103


class GraphWrapperCache:
    def __init__(self, cfg: EngineConfig, graph_buffers: GraphBufferPool, arena: WorkspaceArena):
        self.cfg = cfg
        self.max_bs = graph_buffers.max_bs
        self._bufs_ref = weakref.ref(graph_buffers)
        self._arena_ref = weakref.ref(arena)
        self._live: "weakref.WeakValueDictionary[int, BatchDecodeWithPagedKVCacheWrapper]" = (
            weakref.WeakValueDictionary()
        )
        self.records: dict[int, PlanRecord] = {}

    def build(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        """Create the wrapper one captured graph will hold (called at capture time)."""
        assert bs <= self.max_bs, f"batch size {bs} exceeds the graph buffers ({self.max_bs})"  # expect: FC109
        bufs = self._bufs_ref()
        arena = self._arena_ref()
        if bufs is None or arena is None:
            raise RuntimeError("graph buffers or workspaces were released; call ModelRunner.wake_up() first")
        wrapper = BatchDecodeWithPagedKVCacheWrapper(
            arena.decode_workspace,
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=self.cfg.num_qo_heads // self.cfg.num_kv_heads >= 4,
            paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=bufs.kv_indices,
            paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
        )
        self._live[bs] = wrapper
        self.records[bs] = PlanRecord(bs)
        return wrapper

    def lookup(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        wrapper = self._live.get(bs)
        if wrapper is None:
            raise KeyError(f"no live graph wrapper for batch size {bs}; was its graph dropped?")
        return wrapper

    def is_planned_for(self, bs: int) -> bool:
        wrapper = self._live.get(bs)
        return wrapper is not None and wrapper._fixed_batch_size == bs  # expect: FC103

    def live_sizes(self) -> list[int]:
        return sorted(self._live.keys())

    def disable_graphs(self) -> None:
        for wrapper in list(self._live.values()):
            _force_eager(wrapper)
        logger.warning("graph wrappers switched to eager mode: %s", self.live_sizes())
