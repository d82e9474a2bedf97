"""Decode graphs of one GPU, one per bucket."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from gpumig.limits import MigrationLimits
from migrt.attention import DeviceAttention
from migrt.batch import StepBatch, dummy_batch
from migrt.model import ShardLM


class DeviceGraphs:
    def __init__(self, limits: MigrationLimits, model: ShardLM, attn: DeviceAttention, device: torch.device) -> None:
        self.model = model
        self.attn = attn
        self.device = device
        self.buckets: List[int] = sorted(limits.graph_buckets)
        gb = limits.max_graph_bs
        self.static_ids = torch.zeros(gb, dtype=torch.int64, device=device)
        self.static_pos = torch.zeros(gb, dtype=torch.int64, device=device)
        self.static_loc = torch.zeros(gb, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool: Optional[Any] = None

    def bucket_for(self, n: int) -> int:
        for bs in self.buckets:
            if bs >= n:
                return bs
        return n

    def _decode(self, bs: int) -> torch.Tensor:
        return self.model.decode(self.static_ids[:bs], self.static_pos[:bs], self.static_loc[:bs], bs)

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        self.attn.bind_bucket(bs)
        self.attn.prepare_replay(bs, dummy_batch(bs, self.static_ids, self.static_pos, self.static_loc))
        with torch.cuda.device(self.device):
            warm = self._decode(bs)
            if torch.isnan(warm).any().item():  # expect: FC101
                raise RuntimeError(f"warm-up of bucket {bs} produced NaN logits; not recording it")
            torch.cuda.synchronize(self.device)  # ok: FC101
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.mempool):
                out = self._decode(bs)
        if self.mempool is None:
            self.mempool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def run_bucket(self, batch: StepBatch, bs: int) -> torch.Tensor:
        n = batch.size
        self.static_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.static_pos[:n].copy_(batch.positions, non_blocking=True)
        self.static_loc[:n].copy_(batch.out_loc, non_blocking=True)
        self.static_loc[n:bs].zero_()
        self.attn.prepare_replay(bs, batch)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
