"""Decode graphs, one per batch bucket."""
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from as_attn.backend import AsyncFlashInferBackend
from as_attn.metadata import StepMetadata
from asched import AsyncSchedConfig

from .model import TinyDecoder


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor


class DecodeGraphRunner:
    def __init__(self, model: TinyDecoder, backend: AsyncFlashInferBackend, cfg: AsyncSchedConfig, device: torch.device):
        self.model, self.backend, self.cfg = model, backend, cfg
        self.static_input_ids = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(cfg.max_bucket, dtype=torch.int64, device=device)
        self.entries: Dict[int, GraphEntry] = {}
        self.pool: Optional[tuple] = None

    def capture_all(self, kv_caches: List[torch.Tensor]) -> None:
        self.backend.init_graph_buffers()
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_one(bs, kv_caches)
        torch.cuda.synchronize()  # ok: FC101

    def capture_one(self, bs: int, kv_caches: List[torch.Tensor]) -> None:
        meta = self.backend.dummy_decode_meta(bs, self.static_positions[:bs])
        self.backend.init_forward_metadata_capture_cuda_graph(bs, meta)
        ids = self.static_input_ids[:bs]
        pos = self.static_positions[:bs]
        for _ in range(2):
            self.model.forward_decode(ids, pos, kv_caches, bs, meta)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            hidden = self.model.forward_decode(ids, pos, kv_caches, bs, meta)
        if self.pool is None:
            self.pool = graph.pool()
        self.entries[bs] = GraphEntry(graph=graph, hidden=hidden)

    def replay(self, bs: int, input_ids: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        n = meta.num_reqs
        self.static_input_ids[:n].copy_(input_ids)  # ok: FC104
        self.static_positions[:n].copy_(meta.positions)
        self.backend.prepare_replay(bs, meta)
        entry = self.entries[bs]
        entry.graph.replay()
        return entry.hidden[:n]
