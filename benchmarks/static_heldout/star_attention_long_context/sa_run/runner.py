"""Decode graphs per bucket for phase 2."""

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch

from sa_attn.backend import StarAttentionBackend
from sa_attn.metadata import StepBatch
from sa_run.model import StarDecoder


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor


class StarGraphRunner:
    def __init__(self, model: StarDecoder, backend: StarAttentionBackend, buckets: Sequence[int]):
        assert list(buckets) == sorted(buckets), "buckets must be ascending"  # expect: FC109
        self.model = model
        self.backend = backend
        self.buckets = tuple(buckets)
        max_bs = self.buckets[-1]
        self.static_ids = torch.zeros(max_bs, dtype=torch.int64, device=backend.device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=backend.device)
        self.graphs: Dict[int, GraphEntry] = {}
        self.pool = None
        self.stream: Optional[torch.cuda.Stream] = None

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        self.stream = torch.cuda.Stream()
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids = self.static_ids[:bs]
        pos = self.static_positions[:bs]
        for _ in range(2):
            self.model.forward_decode(ids, pos, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
            out = self.model.forward_decode(ids, pos, bs)
        self.pool = g.pool()
        self.graphs[bs] = GraphEntry(graph=g, output=out, input_ids=ids, positions=pos)
        self.backend.snapshot_plan(bs)

    def bucket_for(self, n: int) -> Optional[int]:
        for b in self.buckets:
            if b >= n:
                return b
        return None

    def replay(self, batch: StepBatch) -> torch.Tensor:
        assert self.graphs, "capture_all() must run before replay()"  # ok: FC109
        n = batch.batch_size
        bs = self.bucket_for(n)
        if bs is None:
            raise ValueError(f"batch of {n} exceeds the largest bucket {self.buckets[-1]}")
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        entry = self.graphs[bs]
        entry.input_ids[:n].copy_(batch.input_ids[:n], non_blocking=True)
        if n == bs:
            # no padding: take the step's positions as they are
            entry.positions = batch.positions[:bs].clone()  # expect: FC107
        else:
            entry.positions[:n].copy_(batch.positions[:n], non_blocking=True)
        entry.graph.replay()
        return entry.output[:n]
