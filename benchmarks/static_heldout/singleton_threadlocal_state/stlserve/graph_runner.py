"""Per-thread CUDA graphs.

A CUDA graph and the FlashInfer wrapper it was recorded with belong to the thread (and stream) that recorded
them, so every worker thread has its own ``ThreadGraphRunner`` (``ThreadState.graph_runner()``), records a
bucket the first time it sees one, and keeps the graph-mode decode wrappers in its ``ThreadWrappers``. The
class keeps a registry of all runners so that process-wide maintenance (page compaction, stats) can reach them.
"""

from __future__ import annotations

import logging
import threading
from typing import ClassVar, Dict, List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from stl_attn.kv_pool import KVPool
from stlserve.batch import ForwardBatch
from stlserve.config import EngineConfig
from stlserve.model import ModelHolder
from stlserve.thread_state import ThreadState
from stlserve.workspace import WorkspaceManager

logger = logging.getLogger(__name__)


class GraphBuffers:
    """Max-size device buffers a thread's graph-mode wrappers are bound to, and the pinned mirrors plan() reads."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        max_bs = cfg.max_graph_bs
        max_pages = max_bs * cfg.max_pages_per_seq
        i32 = dict(dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, **i32)
        self.kv_indices = torch.zeros(max_pages, **i32)
        self.kv_last_page_len = torch.ones(max_bs, **i32)
        self.qo_indptr = torch.arange(max_bs + 1, **i32)
        self.seq_lens = torch.ones(max_bs, **i32)
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_seq, **i32)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.temperatures = torch.ones(max_bs, dtype=torch.float32, device=device)

        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_host = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        self.seq_lens_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.nnz = 0


class GraphEntry:
    """One recorded bucket: the graph and the static tensors it reads and writes."""

    def __init__(
        self,
        graph: torch.cuda.CUDAGraph,
        bs: int,
        static_input_ids: torch.Tensor,
        static_positions: torch.Tensor,
        static_logits: torch.Tensor,
    ) -> None:
        self.graph = graph
        self.bs = bs
        self.static_input_ids = static_input_ids
        self.static_positions = static_positions
        self.static_logits = static_logits
        self.replays = 0


class ThreadGraphRunner:
    _RUNNERS: ClassVar[List["ThreadGraphRunner"]] = []
    _REG_LOCK: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.buckets = tuple(b for b in sorted(cfg.graph_buckets) if b <= cfg.max_batch_size)
        self.max_bs = self.buckets[-1]
        self.bufs = GraphBuffers(cfg, device)
        self.entries: Dict[int, GraphEntry] = {}
        self.model = ModelHolder.model_for(device)
        self.mempool: Optional[tuple] = None
        self._scratch_logits: Optional[torch.Tensor] = None
        self.owner = threading.get_ident()
        self.init_graph_buffers()
        with ThreadGraphRunner._REG_LOCK:
            ThreadGraphRunner._RUNNERS.append(self)

    @classmethod
    def all_runners(cls) -> List["ThreadGraphRunner"]:
        with cls._REG_LOCK:
            return list(cls._RUNNERS)

    @classmethod
    def forget(cls, runner: "ThreadGraphRunner") -> None:
        with cls._REG_LOCK:
            cls._RUNNERS.remove(runner)

    def init_graph_buffers(self) -> None:
        self.bufs.kv_indptr.zero_()  # ok: FC104
        self.bufs.kv_last_page_len.fill_(1)
        self.bufs.kv_indptr_host.zero_()

    def can_run(self, batch_size: int) -> bool:
        return batch_size <= self.max_bs

    def bucket_for(self, batch_size: int) -> int:
        for b in self.buckets:
            if b >= batch_size:
                return b
        raise ValueError(f"batch of {batch_size} exceeds the largest graph bucket {self.max_bs}")

    # -- recording ----------------------------------------------------------------------------------------------

    def _bind_bucket(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        tw = ThreadState.wrappers()
        w = tw.graph_decode.get(bs)
        if w is None:
            w = BatchDecodeWithPagedKVCacheWrapper(
                WorkspaceManager().graph_workspace(self.device),
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.bufs.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.bufs.kv_indices,
                paged_kv_last_page_len_buffer=self.bufs.kv_last_page_len[:bs],
                backend=self.cfg.decode_backend,
            )
            tw.graph_decode[bs] = w
            tw.enable_graphs()
        return w

    def _plan_bucket(self, bs: int) -> None:
        """Plan the dummy batch a bucket is recorded with: one page and one token per row."""
        cfg = self.cfg
        bufs = self.bufs
        bufs.kv_indptr_host[: bs + 1].copy_(torch.arange(bs + 1, dtype=torch.int32))
        bufs.kv_last_page_len_host[:bs].fill_(1)
        bufs.seq_lens_host[:bs].fill_(1)
        bufs.kv_indices[:bs].copy_(torch.arange(bs, dtype=torch.int32, device=self.device))  # ok: FC104
        ThreadState.wrappers().graph_decode[bs].plan(
            bufs.kv_indptr_host[: bs + 1],
            bufs.kv_indices[:bs],
            bufs.kv_last_page_len_host[:bs],
            cfg.num_q_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        bufs.nnz = bs

    def _smoke_test(self, bs: int) -> torch.Tensor:
        """Run the bucket's wrapper once outside the graph, so that a bad plan fails here and not at a replay."""
        cfg = self.cfg
        q = torch.zeros(bs, cfg.num_q_heads, cfg.head_dim, dtype=cfg.dtype, device=self.device)
        kv = KVPool.for_device(self.device).layer(0)
        return ThreadState.wrappers().graph_decode[bs].run(q, kv)  # ok: FC108

    def record_bucket(self, bs: int) -> GraphEntry:
        w = self._bind_bucket(bs)
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bucket {bs} was built for another batch size")
        self._plan_bucket(bs)
        self._smoke_test(bs)
        fb = ForwardBatch.for_capture(bs, self.bufs)
        stream = ThreadState.stream()
        ThreadState.set_capturing(bs)
        try:
            torch.cuda.synchronize()  # ok: FC101
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.model(fb)
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool, stream=stream):
                with torch.cuda.nvtx.range(f"stl.capture bs={bs} kv_pages={fb.kv_indptr[bs]}"):  # expect: FC101
                    logits = self.model(fb)
            torch.cuda.synchronize()
        finally:
            ThreadState.set_capturing(0)
        self.mempool = graph.pool()
        entry = GraphEntry(graph, bs, fb.input_ids, fb.positions, logits)
        self.entries[bs] = entry
        logger.info("thread %s recorded decode bucket %d", threading.current_thread().name, bs)
        return entry

    # -- per step -----------------------------------------------------------------------------------------------

    def load_step(self, batch: ForwardBatch) -> int:
        """Copy a decode batch into the bucket's buffers and re-plan its graph-mode wrapper."""
        cfg = self.cfg
        raw_bs = batch.batch_size
        bs = self.bucket_for(raw_bs)
        bufs = self.bufs
        if (batch.kv_last_page_len == 0).any():  # expect: FC101
            raise ValueError(f"decode batch has an empty last page: {batch.kv_last_page_len}")  # ok: FC101
        logger.debug("load bs=%d (bucket %d) seq_lens=%s", raw_bs, bs, batch.seq_lens)  # ok: FC101
        nnz = int(batch.kv_indptr_cpu[raw_bs])
        if nnz > bufs.kv_indices.numel():
            bufs.kv_indices = torch.empty(2 * nnz, dtype=torch.int32, device=self.device)  # expect: FC107
        bufs.nnz = nnz

        bufs.kv_indptr_host[: raw_bs + 1].copy_(batch.kv_indptr_cpu)
        bufs.kv_indptr_host[raw_bs + 1 : bs + 1].fill_(nnz)
        bufs.kv_last_page_len_host[:raw_bs].copy_(batch.kv_last_page_len_cpu)
        bufs.kv_indices[:nnz].copy_(batch.kv_indices, non_blocking=True)  # ok: FC104
        bufs.kv_last_page_len[:raw_bs].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
        ThreadState.wrappers().graph_decode[bs].plan(  # ok: FC102
            bufs.kv_indptr_host[: bs + 1],
            bufs.kv_indices[:nnz],
            bufs.kv_last_page_len_host[:bs],
            cfg.num_q_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            q_data_type=cfg.dtype,
            kv_data_type=cfg.dtype,
        )
        # padding rows attend to one token of page 0
        bufs.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        entry = self.entries[bs]
        entry.static_input_ids[:raw_bs].copy_(batch.input_ids, non_blocking=True)  # ok: FC104
        bufs.out_cache_loc[:raw_bs].copy_(batch.out_cache_loc, non_blocking=True)
        return bs

    def replay(self, bs: int, raw_bs: int) -> torch.Tensor:
        entry = self.entries[bs]
        entry.graph.replay()
        entry.replays += 1
        if self._scratch_logits is None:
            self._scratch_logits = torch.empty(  # ok: FC107
                self.max_bs, self.cfg.vocab_size, dtype=torch.float32, device=self.device
            )
        out = self._scratch_logits[:raw_bs]
        out.copy_(entry.static_logits[:raw_bs])
        return out
