"""CUDA graphs for pure-decode steps, one per bucket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from cpbp import SchedulerConfig
from cpbp_attn.backend import MixedBatchBackend
from cpbp_attn.host_meta import StepInput
from cpbp_engine.model import TinyModel


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    logits: torch.Tensor


class DecodeGraphRunner:
    def __init__(self, model: TinyModel, backend: MixedBatchBackend, cfg: SchedulerConfig, device: torch.device):
        self.model, self.backend, self.cfg, self.device = model, backend, cfg, device
        self.entries: Dict[int, GraphEntry] = {}
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        return next((bs for bs in sorted(self.cfg.graph_batch_sizes) if bs >= n), None)

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        self.backend.init_graph_buffers()
        for bs in sorted(self.cfg.graph_batch_sizes, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        ids, pos, slots = (torch.zeros(bs, dtype=torch.int64, device=self.device) for _ in range(3))
        meta = self.backend.init_forward_metadata_capture_cuda_graph(bs)
        for _ in range(2):
            self.model.forward_decode(ids, pos, slots, meta)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            logits = self.model.forward_decode(ids, pos, slots, meta)
        if self.pool is None:
            self.pool = graph.pool()
        self.entries[bs] = GraphEntry(graph, ids, pos, slots, logits)

    def replay(self, step: StepInput) -> torch.Tensor:
        n = step.num_reqs
        bs = self.bucket_for(n)
        entry = self.entries[bs]
        self.backend.init_forward_metadata_replay_cuda_graph(bs, step)
        entry.input_ids[:n].copy_(step.input_ids, non_blocking=True)
        entry.slot_mapping[:n].copy_(step.slot_mapping, non_blocking=True)
        entry.positions = step.positions.clone()  # expect: FC107
        entry.graph.replay()
        return entry.logits[:n]
