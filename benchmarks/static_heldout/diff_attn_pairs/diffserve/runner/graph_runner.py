"""CUDA graphs for differential decode, one per bucket; both branch wrappers of a bucket live in one graph."""

from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from diffserve.attention.backend import DiffAttnBackend
from diffserve.attention.metadata import DiffForwardBatch
from diffserve.config import DiffConfig
from diffserve.model.diff_model import DiffLM

logger = logging.getLogger(__name__)


class DiffGraphRunner:
    def __init__(self, cfg: DiffConfig, model: DiffLM, backend: DiffAttnBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        max_bs = cfg.max_graph_bs
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.static_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_logits = torch.zeros(max_bs, cfg.vocab_size, dtype=torch.float32, device=device)
        # padded rows point at the null page 0
        self.null_pages = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.mem_pool: Optional[tuple] = None

    def _dummy_batch(self, bs: int) -> DiffForwardBatch:
        return DiffForwardBatch(
            batch_size=bs,
            rids=[-1] * bs,
            is_decode=True,
            input_ids=self.static_ids[:bs],
            positions=self.static_positions[:bs],
            seq_lens=self.static_seq_lens[:bs],
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
            kv_indices=self.null_pages[:bs],
            kv_last_page_cpu=torch.ones(bs, dtype=torch.int32).pin_memory(),
            out_cache_loc=self.static_loc[:bs],
        )

    def capture_all_buckets(self) -> None:
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.record_bucket(bs)
        logger.info("captured %d differential decode graphs", len(self.graphs))

    def record_bucket(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        self.backend.prepare_graph_step(fb, bs)
        for name, w in fb.branch_wrappers.items():
            if not w._use_cuda_graph:  # expect: FC103
                raise RuntimeError(f"branch {name} of bucket {bs} is not in graph mode")
        # warm-up outside the graph so lazy kernels are loaded before capture
        self.model.forward_decode(fb.input_ids, fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mem_pool):
            logits = self.model.forward_decode(fb.input_ids, fb)
            self.static_logits[:bs].copy_(logits)
            if self.static_logits[:bs].isnan().any():  # expect: FC101
                raise FloatingPointError(f"NaN logits while capturing bucket {bs}")
        if self.mem_pool is None:
            self.mem_pool = g.pool()
        self.graphs[bs] = g

    def replay(self, fb: DiffForwardBatch, bs: int) -> torch.Tensor:
        raw = fb.batch_size
        self.static_ids[:raw].copy_(fb.input_ids)
        self.static_positions = fb.positions.clone()  # expect: FC107
        self.static_seq_lens[:raw].copy_(fb.seq_lens)
        self.static_loc[:raw].copy_(fb.out_cache_loc)
        self.backend.prepare_graph_step(fb, bs)
        self.graphs[bs].replay()
        return self.static_logits[:raw]
