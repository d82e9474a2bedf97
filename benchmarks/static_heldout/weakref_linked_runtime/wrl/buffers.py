"""Device memory the runtime keeps for its whole life: workspaces, step inputs, graph buffers,
pinned staging slots.

Each of these is owned by ``RuntimeResources`` (model_runner.py). Other components get a weak
reference; memory goes back to the allocator through ``weakref.finalize`` or ``__del__`` when
the owner drops it.
"""

from __future__ import annotations

import logging
import weakref

import torch

from wrl.config import PREFILL_WORKSPACE_BYTES, EngineConfig, workspace_bytes_for

logger = logging.getLogger(__name__)


def _release_device_memory(name: str, device: torch.device) -> None:
    # weakref.finalize callback: the owner is gone (engine teardown, sleep mode). Wait for kernels
    # that may still read the freed blocks before handing them back to the driver.
    torch.cuda.synchronize(device)  # ok: FC101
    torch.cuda.empty_cache()
    logger.info("released %s on %s", name, device)


class WorkspaceArena:
    """FlashInfer workspaces, shared by every wrapper of the engine."""

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.device = device
        nbytes = workspace_bytes_for(cfg)
        # FA2 decode wrappers, graph-mode ones included
        self.decode_workspace = torch.zeros(cfg.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        # ragged / paged prefill
        self.prefill_workspace = torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        # trtllm-gen decode (wrl_ext.trtllm_decode): its multi-CTA reduction keeps counters here
        self.trtllm_workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105
        # eager FA2 wrappers (sliding-window layers, batches above the largest graph)
        self.eager_workspace = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
        self._finalizer = weakref.finalize(self, _release_device_memory, "workspace arena", device)


class InputBuffers:
    """Step inputs: device tensors the model (and its graphs) read, with pinned host mirrors the
    scheduler fills from numpy."""

    def __init__(self, cfg: EngineConfig, device: torch.device):
        max_bs = cfg.max_batch_size
        max_tokens = cfg.max_num_tokens
        i32 = dict(dtype=torch.int32, device=device)
        self.device = device
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(max_bs, **i32)
        self.req_pool_indices = torch.zeros(max_bs, **i32)
        self.qo_indptr = torch.zeros(max_bs + 1, **i32)
        self.cu_seq_lens_kv = torch.zeros(max_bs + 1, **i32)
        self.kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, **i32)
        self.kv_last_page_len = torch.ones(max_bs, **i32)

        pinned = dict(dtype=torch.int32, pin_memory=True)
        self.seq_lens_cpu = torch.zeros(max_bs, **pinned)
        self.qo_indptr_cpu = torch.zeros(max_bs + 1, **pinned)
        self.cu_seq_lens_kv_cpu = torch.zeros(max_bs + 1, **pinned)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, **pinned)
        self.kv_last_page_len_cpu = torch.ones(max_bs, **pinned)


class GraphBufferPool:
    """Page-table buffers the captured decode graphs read by address.

    Bound to every graph-mode decode wrapper (``GraphWrapperCache.build``). The attention backend,
    the wrapper cache, the KV pool and the usage reporter reach them through ``weakref.ref``.
    """

    live: "weakref.WeakSet[GraphBufferPool]" = weakref.WeakSet()

    def __init__(self, cfg: EngineConfig, device: torch.device):
        max_bs = max(cfg.cuda_graph_batch_sizes or (1,))
        self.max_bs = max_bs
        self.last_bs = 0  # padded batch size of the last replay, set by the backend
        self.device = device
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        # host mirrors handed to plan()
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        GraphBufferPool.live.add(self)

    def init_cuda_graph_state(self) -> None:
        """Dummy contents for capture: every request one page holding one token."""
        self.kv_indptr_cpu.copy_(torch.arange(self.max_bs + 1, dtype=torch.int32))
        self.kv_last_page_len.fill_(1)  # ok: FC104


class StagingLease:
    """One pinned slot of a ``PinnedStagingPool``. Dropping the lease returns the slot."""

    __slots__ = ("_pool", "index", "n", "host", "event", "__weakref__")

    def __init__(self, pool: "PinnedStagingPool", index: int, n: int):
        self._pool = weakref.proxy(pool)
        self.index = index
        self.n = n
        self.host = pool.slots[index][:n]
        self.event = None

    def mark_queued(self, stream: torch.cuda.Stream) -> None:
        self.event = torch.cuda.Event()
        self.event.record(stream)

    def __del__(self):
        try:
            pool = self._pool
            pool.tokens_staged += int(self.host.ne(0).sum())  # ok: FC101
            pool.release(self.index, self.event)
        except ReferenceError:
            # the pool went first (engine teardown)
            pass


class PinnedStagingPool:
    """Pinned host slots for the per-step token upload. A slot is reused only once the copy that
    read it has finished (its event has completed), checked without blocking."""

    def __init__(self, num_slots: int, slot_tokens: int):
        self.slots = [torch.zeros(slot_tokens, dtype=torch.int64, pin_memory=True) for _ in range(num_slots)]
        self._free: list[tuple[int, object]] = [(i, None) for i in range(num_slots)]
        self.tokens_staged = 0

    def acquire(self, n: int) -> StagingLease:
        for pos, (index, event) in enumerate(self._free):
            if event is None or event.query():
                del self._free[pos]
                return StagingLease(self, index, n)
        raise RuntimeError("all pinned staging slots are still in flight")

    def release(self, index: int, event) -> None:
        self._free.append((index, event))
