"""Decode graphs per bucket; both families are planned before every replay."""

from typing import Dict, Optional

import numpy as np
import torch

from razor import RazorBatch, RazorConfig
from rz_attn.backend import RazorBackend
from rz_run.model import RazorLM


class RazorGraphPool:
    def __init__(self, cfg: RazorConfig, model: RazorLM, backend: RazorBackend, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = device
        self.static_ids = {bs: torch.zeros(bs, dtype=torch.long, device=device) for bs in cfg.buckets}
        self.static_pos = {bs: torch.zeros(bs, dtype=torch.long, device=device) for bs in cfg.buckets}
        self.pad_ids = torch.zeros(max(cfg.buckets), dtype=torch.long, device=device)
        self.outputs: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.mempool = None
        self.replay_log_cpu = torch.zeros(0, dtype=torch.int32)

    def bucket_for(self, n: int) -> Optional[int]:
        return next((b for b in self.cfg.buckets if b >= n), None)

    def _dummy_batch(self, bs: int) -> RazorBatch:
        c = self.cfg
        lens = np.full(bs, c.page_size, dtype=np.int32)
        return RazorBatch(
            batch_size=bs,
            input_ids=self.static_ids[bs],
            positions=self.static_pos[bs],
            seq_lens=torch.from_numpy(lens).to(self.device),
            seq_lens_cpu=lens,
            full_indices=torch.arange(bs, dtype=torch.int32, device=self.device),
            full_page_counts_cpu=np.ones(bs, dtype=np.int32),
            slot_table=torch.zeros(bs, c.comp_width, dtype=torch.int64, device=self.device),
        )

    def record_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.backend.prepare_bucket(bs, self._dummy_batch(bs))
            self.model(self.static_ids[bs], self.static_pos[bs], bs)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.mempool):
                self.outputs[bs] = self.model(self.static_ids[bs], self.static_pos[bs], bs)
            self.mempool = g.pool()
            self.graphs[bs] = g

    def replay(self, bs: int, batch: RazorBatch) -> torch.Tensor:
        self.backend.prepare_bucket(bs, batch)
        n = batch.batch_size
        if n < bs:
            self.static_ids[bs] = torch.cat([batch.input_ids, self.pad_ids[: bs - n]])  # expect: FC107
        else:
            self.static_ids[bs].copy_(batch.input_ids)
        self.static_pos[bs][:n].copy_(batch.positions)
        self.replay_log_cpu = torch.cat([self.replay_log_cpu, torch.tensor([bs], dtype=torch.int32)])  # ok: FC107
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
