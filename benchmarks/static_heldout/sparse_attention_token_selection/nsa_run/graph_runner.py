"""Decode graphs per bucket; each bucket also owns a captured selection graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from nsa import SparseConfig
from nsa_attn.backend import SparseDecodeBackend
from nsa_attn.metadata import DecodeBatch
from nsa_run.model import SparseDecoder


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor


class SparseGraphRunner:
    def __init__(
        self,
        cfg: SparseConfig,
        model: SparseDecoder,
        backend: SparseDecodeBackend,
        kv_cache: torch.Tensor,
        device: torch.device,
    ):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.static_input_ids = {
            bs: torch.zeros(bs, dtype=torch.int64, device=device) for bs in cfg.buckets
        }
        self.graphs: Dict[int, GraphEntry] = {}
        self.pool: Optional[tuple] = None
        self.stream = torch.cuda.Stream()

    def capture_all(self) -> None:
        self.backend.init_cuda_graph_state()
        for bs in reversed(self.cfg.buckets):
            self.backend.capture_selection(bs, self.stream)
            self.capture_one_batch_size(bs)
        self.backend.check_graph_buffers()

    def capture_one_batch_size(self, bs: int) -> None:
        graph = torch.cuda.CUDAGraph()
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        torch.cuda.synchronize()  # ok: FC101
        with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            logits = self.model.forward_decode(self.static_input_ids[bs], self.kv_cache)
        self.pool = graph.pool()
        self.graphs[bs] = GraphEntry(graph=graph, logits=logits)

    def replay(self, batch: DecodeBatch, input_ids: torch.Tensor) -> torch.Tensor:
        assert self.graphs, "capture_all() must run before replay()"  # ok: FC109
        n = batch.batch_size
        bs = self.cfg.bucket_for(n)
        self.static_input_ids[bs] = torch.cat([input_ids, input_ids.new_zeros(bs - n)])  # expect: FC107
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        entry = self.graphs[bs]
        entry.graph.replay()
        return entry.logits[:n]
