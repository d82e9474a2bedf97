"""Decode graphs, one per bucket, recorded largest first."""

from typing import Dict

import torch

from splitkv import DecodeRows, SplitConfig
from splitkv_attn.backend import SplitAttnBackend
from splitkv_run.model import SplitModel


class BucketGraphRunner:
    def __init__(self, cfg: SplitConfig, model: SplitModel, backend: SplitAttnBackend, kv_cache):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.device = backend.device
        self.static_tokens: Dict[int, torch.Tensor] = {}
        self.static_positions: Dict[int, torch.Tensor] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.pool = None
        self.last_bs = 0

    def record_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.backend.build_bucket(bs)
            self.static_tokens[bs] = torch.zeros(bs, dtype=torch.int64, device=self.device)  # ok: FC107
            self.static_positions[bs] = torch.zeros(bs, dtype=torch.int64, device=self.device)
            self._record(bs)
        torch.cuda.synchronize()  # ok: FC101

    def _record(self, bs: int) -> None:
        self.backend.plan_for_capture(bs)
        tokens, positions = self.static_tokens[bs], self.static_positions[bs]
        for _ in range(2):
            self.model.decode(tokens, positions, self.kv_cache, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.outputs[bs] = self.model.decode(tokens, positions, self.kv_cache, bs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g

    def bucket_for(self, n: int) -> int:
        for b in self.cfg.buckets:
            if b >= n:
                return b
        raise ValueError(f"{n} rows exceed the largest bucket")

    def replay_bucket(self, rows: DecodeRows) -> torch.Tensor:
        real = rows.batch_size
        bs = self.bucket_for(real)
        self.backend.prepare_decode_replay(bs, rows)
        self.static_tokens[bs][:real].copy_(rows.tokens_dev)
        self.static_positions[bs][:real].copy_(rows.positions_dev)
        self.graphs[bs].replay()
        self.last_bs = bs
        return self.outputs[bs][:real]

    def replay_stats(self) -> dict:
        return {"bucket": self.last_bs, "seq_lens": self.backend.decode_seq_lens[: self.last_bs].tolist()}  # ok: FC101
