"""Plain-decode graphs, one per bucket."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from lookahead import LookaheadConfig
from la_attn.batch import LookaheadBatch
from la_attn.decode_backend import DecodeBackend
from la_engine.model import LookaheadModel


class DecodeGraphRunner:
    def __init__(self, model: LookaheadModel, backend: DecodeBackend, cfg: LookaheadConfig, device: torch.device):
        self.model, self.backend, self.cfg = model, backend, cfg
        self.static_input_ids = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=device)
        self.static_slots = torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.side_stream = torch.cuda.Stream()
        self.pool = None

    def bucket_for(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.graph_buckets if bs >= n), None)

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        for bs in reversed(self.cfg.graph_buckets):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        ids, pos, slots = self.static_input_ids[:bs], self.static_positions[:bs], self.static_slots[:bs]
        with torch.cuda.stream(self.side_stream):
            self.model.decode(ids, pos, slots, bs)
        self.side_stream.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool, stream=self.side_stream):
            self.logits[bs] = self.model.decode(ids, pos, slots, bs)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[bs] = graph

    def replay(self, batch: LookaheadBatch) -> torch.Tensor:
        n = batch.num_rows
        bs = self.bucket_for(n)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.static_input_ids.resize_(bs)  # expect: FC107
        self.static_input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.static_positions[:n].copy_(batch.positions, non_blocking=True)
        self.static_slots[:n].copy_(batch.slot_mapping, non_blocking=True)
        self.graphs[bs].replay()
        return self.logits[bs][:n]
