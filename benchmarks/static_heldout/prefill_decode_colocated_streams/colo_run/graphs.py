"""Decode graphs, one per bucket, recorded and replayed on the decode stream."""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence

import torch

from colo import DecodeBatch
from colo_attn.decode_attn import DecodeAttention
from colo_run.model import ColoModel


class DecodeGraphs:
    _STATIC_INPUTS = ("input_ids", "positions", "seq_lens")

    def __init__(
        self,
        model: ColoModel,
        attn: DecodeAttention,
        kv_caches: List[torch.Tensor],
        buckets: Sequence[int],
        stream: torch.cuda.Stream,
        device: torch.device,
    ):
        self.model = model
        self.attn = attn
        self.kv_caches = kv_caches
        self.buckets = sorted(buckets)
        self.stream = stream
        max_bs = self.buckets[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    @property
    def max_bs(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, n: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, n)]

    def record(self) -> None:
        self.attn.init_graph_wrappers(self.buckets)
        for bs in reversed(self.buckets):
            self.attn.prepare_capture(bs)
            with torch.cuda.stream(self.stream):
                self.model.forward_decode(self.input_ids[:bs], self.kv_caches, bs)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool, stream=self.stream):
                self.outputs[bs] = self.model.forward_decode(self.input_ids[:bs], self.kv_caches, bs)
            self.pool = g.pool()
            self.graphs[bs] = g

    def load_inputs(self, batch: DecodeBatch) -> None:
        for name in self._STATIC_INPUTS:
            setattr(self, name, getattr(batch, name).clone())  # expect: FC107

    def replay(self, batch: DecodeBatch, bs: int) -> torch.Tensor:
        n = batch.batch_size
        self.load_inputs(batch)
        seq_lens_cpu = torch.ones(bs, dtype=torch.int32)
        seq_lens_cpu[:n] = batch.seq_lens_cpu
        self.attn.prepare_replay(bs, n, seq_lens_cpu, batch.kv_indices)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
