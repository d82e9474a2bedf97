"""Decode step + sampling captured together, one CUDA graph per batch-size bucket."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch

from engine_rt.attention import DecodeAttention, DecodeBatch
from engine_rt.config import EngineConfig
from engine_rt.model import DecodeModel
from sampling.params import SamplingBatch
from sampling.sampler import GraphSampler

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, model: DecodeModel, attn: DecodeAttention, sampler: GraphSampler, cfg: EngineConfig,
                 device: torch.device):
        self.model = model
        self.attn = attn
        self.sampler = sampler
        self.device = device
        self.buckets: List[int] = sorted(cfg.graph_buckets)
        max_bs = max(self.buckets)
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.slot_pages = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.slot_offsets = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.out_tokens: Dict[int, torch.Tensor] = {}

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.buckets if b >= n), None)

    def _body(self, bs: int) -> torch.Tensor:
        logits = self.model.forward_decode_graph(
            self.input_ids[:bs], self.positions[:bs], self.slot_pages[:bs], self.slot_offsets[:bs], bs
        )
        return self.sampler.sample_body(logits, bs)

    def capture_decode_graphs(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.buckets):
            self.attn.replay_prepare(DecodeBatch.dummy(bs, self.device), bs)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._body(bs)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.out_tokens[bs] = self._body(bs)
            self.graphs[bs] = g
        torch.cuda.synchronize()
        logger.info("captured decode+sample graphs for buckets %s", self.buckets)

    def replay(self, batch: DecodeBatch, sb: SamplingBatch, bs: int) -> torch.Tensor:
        n = batch.size
        self.attn.replay_prepare(batch, bs)
        self.sampler.prepare(sb, bs)
        self.input_ids[:n].copy_(batch.input_ids)
        self.positions[:n].copy_(batch.positions)
        self.slot_pages[:n].copy_(batch.slot_pages)
        self.slot_offsets[:n].copy_(batch.slot_offsets)
        # padded rows write their KV into the null page
        self.slot_pages[n:bs].zero_()
        self.graphs[bs].replay()
        return self.out_tokens[bs][:n]
