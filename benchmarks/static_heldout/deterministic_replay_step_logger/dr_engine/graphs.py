"""Decode graphs per bucket."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional

import torch

from dr_attn.backend import ReplayableBackend
from dr_engine.batch import StepBatch
from dr_engine.config import EngineConfig
from dr_engine.model import ReplayLM


@dataclasses.dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class BucketGraphs:
    _STATIC_NAMES = ("input_ids", "positions")

    def __init__(self, cfg: EngineConfig, model: ReplayLM, backend: ReplayableBackend,
                 kv_cache: torch.Tensor, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.device = device
        self.input_ids = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(cfg.max_batch, dtype=torch.long, device=device)
        self.graphs: Dict[int, GraphEntry] = {}
        self.mempool: Optional[tuple] = None

    def bucket_for(self, bs: int) -> Optional[int]:
        return next((b for b in self.cfg.buckets if b >= bs), None)

    def capture_all(self) -> None:
        self.backend.init_graph_wrappers()
        torch.cuda.synchronize(self.device)  # ok: FC101
        for bs in sorted(self.cfg.buckets, reverse=True):
            self._capture_bucket(bs)

    def _capture_bucket(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids, pos = self.input_ids[:bs], self.positions[:bs]
        self.model.decode(ids, pos, self.kv_cache, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            logits = self.model.decode(ids, pos, self.kv_cache, bs)
        if self.mempool is None:
            self.mempool = g.pool()
        self.graphs[bs] = GraphEntry(graph=g, logits=logits)

    def replay(self, bs: int, batch: StepBatch) -> torch.Tensor:
        # the recorded steps and the live steps take the same path
        for name in self._STATIC_NAMES:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        entry = self.graphs[bs]
        entry.graph.replay()
        return entry.logits[: batch.batch_size]
