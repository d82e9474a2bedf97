"""Decode graphs per padded batch size."""
from __future__ import annotations

from typing import Dict, List

import torch

from modserve.attention import DecodeBatch, MoDAttnBackend
from modserve.config import MoDConfig
from modserve.model import MoDModel


class MoDGraphRunner:
    def __init__(self, model: MoDModel, backend: MoDAttnBackend, cfg: MoDConfig, kv_caches: List[torch.Tensor]):
        self.model = model
        self.backend = backend
        self.cfg = cfg
        self.kv_caches = kv_caches
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.static_ids = torch.zeros(cfg.max_batch, dtype=torch.int64, device=backend.device)

    def can_run(self, bs: int) -> bool:
        return self.cfg.graph_bucket(bs) in self.graphs

    def record_bucket(self, bs: int, dummy: DecodeBatch) -> None:
        """Capture one batch size (configured as a capture path)."""
        self.backend.capture_max_seq_len = int(dummy.seq_lens.max())  # expect: FC101
        self.backend.plan_for_capture(bs, dummy)
        torch.cuda.synchronize()  # ok: FC101
        for _ in range(2):  # warm-up outside the graph
            self.model.forward_decode(self.static_ids[:bs], self.kv_caches, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs] = self.model.forward_decode(self.static_ids[:bs], self.kv_caches, bs)
        self.graphs[bs] = g

    def capture_all(self, make_dummy) -> None:
        self.backend.init_cuda_graph_state()
        for bs in reversed(self.cfg.graph_batch_sizes):
            self.record_bucket(bs, make_dummy(bs))

    def replay(self, input_ids: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        bs = self.cfg.graph_bucket(batch.bs)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        self.static_ids[: batch.bs].copy_(input_ids)
        self.graphs[bs].replay()
        return self.outputs[bs][: batch.bs]
