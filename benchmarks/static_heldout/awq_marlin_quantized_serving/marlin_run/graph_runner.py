"""Decode CUDA graphs, one per batch bucket."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Sequence

import torch

from marlin_attn.backend import AWQAttnBackend
from marlin_attn.metadata import DecodeMeta
from marlin_run.model import QuantLlama


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    static_positions: torch.Tensor
    output: torch.Tensor


class DecodeGraphRunner:
    def __init__(self, backend: AWQAttnBackend, model: QuantLlama, buckets: Sequence[int],
                 device: torch.device):
        assert list(buckets) == sorted(buckets), "buckets must be ascending"  # expect: FC109
        self.backend = backend
        self.model = model
        self.buckets = list(buckets)
        max_bs = self.buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.graphs: Dict[int, GraphEntry] = {}
        self.graph_max_len: Dict[int, int] = {}
        self.pool: Optional[tuple] = None

    def capture_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        w = self.backend.graph_wrappers[bs]
        if not w._use_cuda_graph:  # expect: FC103
            raise RuntimeError(f"bucket {bs} wrapper is not in CUDA-graph mode")
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        positions = self.static_positions[:bs]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.model.forward_decode(self.static_input_ids[:bs], positions)
        self.pool = graph.pool()
        self.graphs[bs] = GraphEntry(graph=graph, static_positions=positions, output=out)
        self.graph_max_len[bs] = self.static_seq_lens[:bs].max().item()  # expect: FC101

    def replay(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        real_bs = input_ids.shape[0]
        bs = next((b for b in self.buckets if b >= real_bs), None)
        if bs is None:
            raise RuntimeError(f"no graph for batch {real_bs}; static lens {self.static_seq_lens}")  # ok: FC101
        entry = self.graphs[bs]
        self.static_input_ids[:real_bs].copy_(input_ids, non_blocking=True)
        entry.static_positions = positions.clone()  # expect: FC107
        self.static_seq_lens[:real_bs].copy_(meta.seq_lens, non_blocking=True)
        if (self.static_seq_lens[:bs] == 0).any():  # expect: FC101
            self.static_seq_lens[real_bs:bs].fill_(1)  # ok: FC104
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        entry.graph.replay()
        return entry.output[:real_bs]
