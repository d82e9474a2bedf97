"""Decode graphs per bucket, recorded over the staged device buffers."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from ringstage import RingConfig, StepInputs
from rs_attn.backend import StagedDecodeBackend
from rs_runtime.model import StagedModel

_STATIC_INPUTS = ("input_ids", "positions")


class StagedGraphs:
    def __init__(self, model: StagedModel, backend: StagedDecodeBackend, cfg: RingConfig, device: torch.device):
        self.model, self.backend, self.cfg = model, backend, cfg
        self.input_ids = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.graph_buckets if bs >= n), None)

    def record_all(self) -> None:
        for bs in reversed(self.cfg.graph_buckets):
            self.record(bs)

    def record(self, bs: int) -> None:
        self.backend.plan_null_bucket(bs)
        ids, pos = self.input_ids[:bs], self.positions[:bs]
        self.model.forward_bucket(ids, pos, bs)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[bs] = self.model.forward_bucket(ids, pos, bs)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, bs: int, inputs: StepInputs) -> Tuple[torch.Tensor, torch.Tensor]:
        for name in _STATIC_INPUTS:
            setattr(self, name, getattr(inputs, name).clone())  # expect: FC107
        self.graphs[bs].replay()
        return self.outputs[bs]
