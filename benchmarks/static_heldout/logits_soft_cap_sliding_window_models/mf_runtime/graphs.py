"""Decode graphs per (family, bucket)."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import torch

from mfserve import ServeConfig
from mf_attn.backend import FamilyBackend
from mf_runtime.batch import FamilyBatch
from mf_runtime.model import FamilyModel

Key = Tuple[str, int]


class FamilyGraphs:
    def __init__(self, models: Dict[str, FamilyModel], backend: FamilyBackend, cfg: ServeConfig, device):
        self.models, self.backend, self.cfg, self.device = models, backend, cfg, device
        self.graphs: Dict[Key, torch.cuda.CUDAGraph] = {}
        self.static_ids: Dict[Key, torch.Tensor] = {}
        self.static_positions: Dict[str, torch.Tensor] = {
            fam: torch.zeros(cfg.max_graph_bs, dtype=torch.int64, device=device) for fam in models
        }
        self.outputs: Dict[Key, torch.Tensor] = {}
        self.pool = None

    def _validate_buckets(self, buckets: Sequence[int]) -> None:
        assert all(b > 0 for b in buckets) and list(buckets) == sorted(buckets)  # ok: FC109

    def capture_all(self) -> None:
        self._validate_buckets(self.cfg.graph_buckets)
        for fam in self.models:
            self.backend.init_family_buffers(fam)
            for bs in reversed(self.cfg.graph_buckets):
                self.capture_family_bucket(fam, bs)

    def capture_family_bucket(self, fam: str, bs: int) -> None:
        key = (fam, bs)
        self.static_ids[key] = torch.zeros(bs, dtype=torch.int64, device=self.device)  # ok: FC107
        self.backend.plan_bucket_dummy(fam, bs)
        model, ids, pos = self.models[fam], self.static_ids[key], self.static_positions[fam][:bs]
        model.forward_decode(ids, pos, bs)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[key] = model.forward_decode(ids, pos, bs)
        self.pool = self.pool or graph.pool()
        self.graphs[key] = graph

    def check_buckets(self) -> None:
        for fam, bs in self.graphs:
            if self.backend.bucket_wrappers[fam][bs]._fixed_batch_size != bs:  # expect: FC103
                raise RuntimeError(f"{fam}: bucket {bs} wrapper was built for another batch size")

    def bucket_for(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.graph_buckets if bs >= n), None)

    def can_replay(self, fam: str, n: int) -> bool:
        assert self.pool is not None, "capture_all() has not run"  # ok: FC109
        bs = self.bucket_for(n)
        return bs is not None and (fam, bs) in self.graphs

    def replay(self, fam: str, batch: FamilyBatch) -> torch.Tensor:
        n = batch.num_rows
        bs = self.bucket_for(n)
        self.backend.prepare_replay(fam, bs, batch)
        self.static_ids[(fam, bs)][:n].copy_(batch.input_ids, non_blocking=True)
        self.static_positions[fam] = torch.cat([batch.positions, self.static_positions[fam][n:]])  # expect: FC107
        self.graphs[(fam, bs)].replay()
        return self.outputs[(fam, bs)][:n]
