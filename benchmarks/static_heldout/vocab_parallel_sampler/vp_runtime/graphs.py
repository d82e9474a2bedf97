"""Decode + distributed sampling recorded as one graph per bucket (NCCL all-gathers inside)."""
from __future__ import annotations

from typing import Dict, Optional

import torch

from vpsample.attn.metadata import RankAttnMetadata
from vpsample.config import TPServeConfig
from vpsample.sampling.params import SamplingTensors
from vpsample.sampling.sampler import VocabParallelSampler
from vpsample.step import RankStep
from vp_runtime.model import VocabParallelLM


class SamplerGraphs:
    def __init__(
        self,
        cfg: TPServeConfig,
        model: VocabParallelLM,
        meta: RankAttnMetadata,
        sampler: VocabParallelSampler,
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.meta = meta
        self.sampler = sampler
        rows = max(cfg.graph_buckets)
        self.static_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.static_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.static_page = torch.zeros(rows, dtype=torch.long, device=device)
        self.static_off = torch.zeros(rows, dtype=torch.long, device=device)
        self.static_params = SamplingTensors.static(rows, sampler.max_k, device)
        self.static_next = torch.zeros(rows, dtype=torch.long, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.mempool = None
        self._ready = torch.cuda.Event()

    def bucket_for(self, bs: int) -> Optional[int]:
        for b in sorted(self.cfg.graph_buckets):
            if b >= bs:
                return b
        return None

    def record_all(self) -> None:
        self.meta.init_graph_buffers()
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.record(bs)

    def record(self, bs: int) -> None:
        self.meta.warm_bucket(bs)
        assert (self.static_params.top_p <= 1.0).all(), "static sampling parameters hold garbage"  # expect: FC101
        self._ready.record()
        self._ready.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            logits = self.model.decode(
                self.static_ids[:bs], self.static_pos[:bs], self.static_page[:bs], self.static_off[:bs], bs
            )
            self.static_next[:bs].copy_(self.sampler.sample_static(logits, self.static_params, bs))
        self.mempool = graph.pool()
        self.graphs[bs] = graph

    def replay_bucket(
        self, step: RankStep, params: SamplingTensors, out_page: torch.Tensor, out_off: torch.Tensor, padded: int
    ) -> torch.Tensor:
        bs = step.num_rows
        self.static_ids[:bs].copy_(step.input_ids)
        self.static_pos[:bs].copy_(step.positions)
        self.static_page[:bs].copy_(out_page)
        self.static_off[:bs].copy_(out_off)
        params.copy_into(self.static_params, bs)
        self.graphs[padded].replay()
        return self.static_next[:bs]

    def replay_debug_dump(self, bs: int) -> Dict[str, list]:
        return {
            "ids": self.static_ids[:bs].cpu().tolist(),  # ok: FC101
            "next": self.static_next[:bs].tolist(),
        }
