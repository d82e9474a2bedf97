"""Decode graphs per static batch bucket."""
from __future__ import annotations

from typing import Dict, List

import torch

from batchgen.flashinfer_backend import OfflineFlashInferBackend
from batchgen.metadata import BucketMetadata
from batchgen.model import OfflineLlama


class BucketGraphRunner:
    def __init__(self, model: OfflineLlama, backend: OfflineFlashInferBackend, kv_caches: List[torch.Tensor], max_bs: int):
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.ids = torch.zeros(max_bs, dtype=torch.int64, device=backend.device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=backend.device)
        self._captured = False

    def capture_bucket(self, md: BucketMetadata) -> None:
        bs = md.bs
        w = self.backend.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for {bs} was built for another batch size")
        self.backend.init_forward_metadata_replay_cuda_graph(md)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self.logits[bs] = self.model(self.ids[:bs], self.positions[:bs], self.kv_caches, True)
        self.graphs[bs] = g

    def capture_all(self, dummies: List[BucketMetadata]) -> None:
        self.backend.init_graph_wrappers()
        for md in dummies:
            self.capture_bucket(md)
        self._captured = True

    def replay(self, ids: torch.Tensor, md: BucketMetadata) -> torch.Tensor:
        assert self._captured, "capture_all() must run first"  # ok: FC109
        bs = md.bs
        self.backend.init_forward_metadata_replay_cuda_graph(md)
        self.ids[:bs].copy_(ids)
        self.positions[:bs].copy_(md.positions)
        self.graphs[bs].replay()
        return self.logits[bs]
