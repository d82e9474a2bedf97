"""CUDA graphs for decode-only buckets and for full-budget hybrid steps (steady state fills the budget)."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from sarathi.build.batch_builder import HybridBatch, HybridBatchBuilder
from sarathi.config import GRAPH_BUCKETS, SchedulerConfig
from sarathi_rt.attention import ChunkedAttentionBackend
from sarathi_rt.model import PiggybackDecoder

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(
        self,
        model: PiggybackDecoder,
        backend: ChunkedAttentionBackend,
        builder: HybridBatchBuilder,
        cfg: SchedulerConfig,
        device: torch.device,
    ):
        self.model = model
        self.backend = backend
        self.builder = builder
        self.cfg = cfg
        self.device = device
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.hybrid_graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.hybrid_logits: Dict[int, torch.Tensor] = {}
        self.plan_info: Dict[int, object] = {}
        self.static_input_ids = torch.zeros(cfg.token_budget, dtype=torch.int64, device=device)
        self.backend.init_cuda_graph_state()

    def bucket_for(self, batch: HybridBatch) -> Optional[int]:
        if batch.num_prefill_tokens > 0:
            return None
        for bs in GRAPH_BUCKETS:
            if bs >= batch.num_decodes:
                return bs
        return None

    def has_hybrid(self, num_tokens: int) -> bool:
        return num_tokens in self.hybrid_graphs

    def capture_all(self) -> None:
        for bs in sorted(GRAPH_BUCKETS, reverse=True):
            self.capture_one_batch_size(bs)
        for budget in self.cfg.hybrid_budgets:
            self.capture_hybrid_budget(budget)
        logger.info("captured %d decode and %d hybrid graphs", len(self.graphs), len(self.hybrid_graphs))

    def capture_one_batch_size(self, bs: int) -> None:
        batch = self.builder.dummy_batch(bs)
        self.backend.init_forward_metadata(batch, bs)
        num_pages = self.backend.kv_indptr_buf[bs].item()  # expect: FC101
        logger.info("capturing decode bucket bs=%d over %d pages", bs, num_pages)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.static_logits[bs] = self.model.decode(self.static_input_ids[:bs], batch)
        self.graphs[bs] = g
        # remembered so that a re-plan with another split can be detected in debug builds
        self.plan_info[bs] = self.backend.graph_decode_wrappers[bs]._plan_info  # expect: FC103

    def capture_hybrid_budget(self, num_tokens: int) -> None:
        nd = min(max(GRAPH_BUCKETS), num_tokens // 2)
        batch = self.builder.dummy_batch(nd, chunk_tokens=num_tokens - nd)
        self.backend.init_forward_metadata(batch, None)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.hybrid_logits[num_tokens] = self.model.forward_hybrid(self.static_input_ids[:num_tokens], batch)
        self.hybrid_graphs[num_tokens] = g

    def replay(self, bs: int, batch: HybridBatch) -> torch.Tensor:
        nd = batch.num_decodes
        self.static_input_ids[:nd].copy_(batch.input_ids[:nd])
        self.graphs[bs].replay()
        return self.static_logits[bs][:nd]

    def replay_hybrid(self, batch: HybridBatch) -> torch.Tensor:
        n = batch.input_ids.shape[0]
        self.static_input_ids[:n].copy_(batch.input_ids)
        self.hybrid_graphs[n].replay()
        return self.hybrid_logits[n][: batch.num_seqs]
