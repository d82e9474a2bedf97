"""Decode CUDA graphs per bucket."""
from __future__ import annotations

import bisect
from typing import Optional

import torch

from llumlet.attn.backend import DecodeBatch, InstanceAttnBackend
from llumlet.config import InstanceConfig
from llumlet.engine.model import DecoderModel


class DecodeGraphRunner:
    def __init__(self, cfg: InstanceConfig, model: DecoderModel, backend: InstanceAttnBackend, kv_caches: list, device):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.device = device
        self.buckets = sorted(cfg.graph_buckets)
        self.max_bs = self.buckets[-1]
        self.input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.slot_mapping = torch.full((self.max_bs,), -1, dtype=torch.int64, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def bucket_for(self, n: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def capture_all(self) -> None:
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        seq_lens_cpu = self.seq_lens[:bs].cpu()  # expect: FC101
        meta = self.backend.capture_metadata(bs, seq_lens_cpu, self.slot_mapping[:bs])
        for _ in range(2):
            self.model(self.input_ids[:bs], self.kv_caches, meta)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model(self.input_ids[:bs], self.kv_caches, meta)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g
        self.logits[bs] = logits

    def replay(self, bs: int, batch: DecodeBatch) -> torch.Tensor:
        n = len(batch.rids)
        w = self.backend.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bucket {bs} was planned for another batch size")
        self.input_ids = self.input_ids.new_zeros(self.max_bs)  # expect: FC107
        self.input_ids[:n].copy_(batch.input_ids)
        self.seq_lens[:n].copy_(batch.seq_lens)
        self.slot_mapping[:n].copy_(batch.slot_mapping)
        self.backend.prepare_replay(bs, batch)
        # padded rows must not write KV: their slots point nowhere
        self.slot_mapping[n:bs].fill_(-1)  # ok: FC104
        self.graphs[bs].replay()
        return self.logits[bs][:n]
