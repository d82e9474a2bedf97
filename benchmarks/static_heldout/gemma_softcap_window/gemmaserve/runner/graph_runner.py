"""Decode CUDA graphs, one per batch bucket, over graph-mode wrappers of both layer types."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence

import torch

from gemmaserve.attn.backend import GemmaFlashInferBackend, GraphBuffers
from gemmaserve.common import LAYER_ROW, GemmaConfig, LayerType, StepBatch, window_page_range
from gemmaserve.model import GemmaForCausalLM

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(
        self, model: GemmaForCausalLM, backend: GemmaFlashInferBackend, cfg: GemmaConfig, device: torch.device
    ) -> None:
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch_size
        self.buffers = GraphBuffers.allocate(cfg, device)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.out_cache_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_logits = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.float32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool: Optional[tuple] = None
        self.kv_caches: List[torch.Tensor] = []
        self.init_graph_buffers()

    def init_graph_buffers(self) -> None:
        # every padded row reads one token of page 0 until a real request lands there
        self.buffers.kv_last_page_len.fill_(1)  # ok: FC104
        self.buffers.kv_last_page_len_cpu.fill_(1)
        self.out_cache_loc.zero_()

    # ------------------------------------------------------------------ capture
    def record_all(self, kv_caches: List[torch.Tensor]) -> None:
        self.kv_caches = kv_caches
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.cfg.batch_buckets):
            self.record_bucket(bs)
        logger.info("captured %d decode graphs", len(self.graphs))

    def record_bucket(self, bs: int) -> None:
        bufs = self.buffers
        self.backend.bind_graph_wrappers(bs, bufs)
        # dummy batch for the capture: every request owns one token on page 0
        bufs.kv_indptr_cpu[:, : bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        bufs.kv_indices_cpu[:, :bs] = 0
        self.backend.graph_bs = bs
        self.backend.max_seq_len = self.cfg.max_context_len
        self.backend.plan_graph(bs, bufs, (bs, bs))
        self.static_logits[:bs] = self._run_model(bs)  # warm-up outside the graph loads the lazy kernels
        if not torch.isfinite(self.static_logits[:bs]).all():  # expect: FC101
            raise RuntimeError(f"non-finite logits while warming up bucket {bs}")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.static_logits[:bs] = self._run_model(bs)
        self.pool = graph.pool()
        self.graphs[bs] = graph
        self.backend.graph_bs = None

    def _run_model(self, bs: int) -> torch.Tensor:
        return self.model(
            self.input_ids[:bs], self.static_positions[:bs], self.out_cache_loc[:bs], self.kv_caches
        )

    # ------------------------------------------------------------------ replay
    def replay(self, batch: StepBatch) -> torch.Tensor:
        raw_bs = batch.batch_size
        bs = self.cfg.bucket_for(raw_bs)
        self.backend.graph_bs = bs
        self.load_inputs(batch, bs)
        self.graphs[bs].replay()
        self.backend.graph_bs = None
        return self.static_logits[:raw_bs]

    def load_inputs(self, batch: StepBatch, bs: int) -> None:
        raw_bs = batch.batch_size
        bufs = self.buffers
        self.input_ids[:raw_bs].copy_(batch.input_ids, non_blocking=True)
        self.out_cache_loc[:raw_bs].copy_(batch.out_cache_loc, non_blocking=True)
        self.static_positions = torch.zeros(bs, dtype=torch.int64, device=self.device)  # expect: FC107
        self.static_positions[:raw_bs] = batch.positions
        nnz = self._fill_host_pages(batch, bs)
        for lt in LayerType:
            row = LAYER_ROW[lt]
            bufs.kv_indices[row, : nnz[row]].copy_(bufs.kv_indices_cpu[row, : nnz[row]], non_blocking=True)  # ok: FC104
        if self.backend.use_trtllm_global:
            self.backend.fill_block_tables(batch)
        self.backend.plan_graph(bs, bufs, nnz)
        # padded rows read one token of page 0
        bufs.kv_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104

    def _fill_host_pages(self, batch: StepBatch, bs: int) -> Sequence[int]:
        """Fill the pinned mirrors for both layer types; returns the page count of each row."""
        bufs = self.buffers
        ps = self.cfg.page_size
        lens = batch.seq_lens_cpu.tolist()  # ok: FC101
        indptr = bufs.kv_indptr_cpu.numpy()
        indices = bufs.kv_indices_cpu.numpy()
        last = bufs.kv_last_page_len_cpu.numpy()
        nnz = [0, 0]
        for i in range(bs):
            n = lens[i] if i < len(lens) else 1
            spans = {
                LayerType.SLIDING: window_page_range(n, self.cfg.sliding_window, ps),
                LayerType.GLOBAL: (0, (n + ps - 1) // ps),
            }
            for lt, (first, end) in spans.items():
                row = LAYER_ROW[lt]
                count = end - first
                if i < len(lens):
                    indices[row, nnz[row] : nnz[row] + count] = batch.page_table_np[i, first:end]
                else:
                    indices[row, nnz[row] : nnz[row] + count] = 0
                nnz[row] += count
                indptr[row, i + 1] = nnz[row]
            last[i] = n - ((n + ps - 1) // ps - 1) * ps
        return nnz
