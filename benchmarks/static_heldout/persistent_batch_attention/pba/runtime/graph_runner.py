"""Decode-only batches replay a graph per padded size; mixed batches run eagerly."""

import bisect
from dataclasses import dataclass
from typing import Dict, List

import torch

from pba.backend.holistic import HolisticAttnBackend
from pba.batch_info import MixedBatchInfo
from pba.config import EngineConfig
from pba.model import MixedModel


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class PersistentGraphRunner:
    _STATIC_INPUTS = ("static_input_ids", "static_positions")

    def __init__(self, cfg: EngineConfig, model: MixedModel, backend: HolisticAttnBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.sizes: List[int] = sorted(cfg.graph_sizes)
        self.max_bs = self.sizes[-1]
        self.backend.init_graph_buffers(self.max_bs)
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.long, device=device)
        self.entries: Dict[int, GraphEntry] = {}
        self.pool = None

    def can_run(self, bs: int) -> bool:
        return bs <= self.max_bs

    def warm_and_record(self) -> None:
        for bs in reversed(self.sizes):
            self.backend.bind_graph_wrapper(bs)
            self.model.decode_forward(self.static_input_ids[:bs], self.static_positions[:bs], bs)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                logits = self.model.decode_forward(self.static_input_ids[:bs], self.static_positions[:bs], bs)
            if self.pool is None:
                self.pool = g.pool()
            self.entries[bs] = GraphEntry(g, logits)

    def plan_is_stale(self, bs: int) -> bool:
        w = self.backend.graph_decode[bs]
        return w._plan_info is None  # expect: FC103

    def reset_static_inputs(self) -> None:
        # aborted rows must not leave token ids behind for the next replay
        for name in self._STATIC_INPUTS:
            setattr(self, name, torch.zeros_like(getattr(self, name)))  # expect: FC107

    def replay(self, info: MixedBatchInfo, input_ids: torch.Tensor) -> torch.Tensor:
        bs = info.num_reqs
        padded = self.sizes[bisect.bisect_left(self.sizes, bs)]
        self.static_input_ids[:bs].copy_(input_ids)
        self.static_positions = info.positions.clone()  # expect: FC107
        self.backend.prepare_graph_inputs(info, padded)
        entry = self.entries[padded]
        entry.graph.replay()
        return entry.logits[:bs]

    def relaunch(self, bs: int, next_ids: torch.Tensor) -> torch.Tensor:
        padded = self.sizes[bisect.bisect_left(self.sizes, bs)]
        self.static_input_ids[:bs].copy_(next_ids)
        self.static_positions[:bs].add_(1)
        entry = self.entries[padded]
        entry.graph.replay()
        return entry.logits[:bs]
