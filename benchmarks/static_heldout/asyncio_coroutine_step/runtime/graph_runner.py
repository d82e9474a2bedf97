"""The attention-only decoder stack and its per-bucket CUDA graphs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from aiostep import EngineConfig, ScheduledBatch
from attn.backend import AsyncFlashInferBackend


class DecodeModel:
    def __init__(self, cfg: EngineConfig, backend: AsyncFlashInferBackend, kv_caches: list[torch.Tensor]):
        self.cfg, self.backend, self.kv_caches = cfg, backend, kv_caches
        inv_freq = 1.0 / (10000 ** (torch.arange(cfg.head_dim, device=kv_caches[0].device) / cfg.head_dim))
        self.rope_cos = torch.outer(torch.arange(cfg.max_seq_len, device=inv_freq.device), inv_freq).cos()

    def forward_graph(self, q: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = q * self.rope_cos[positions][:, None, :].to(q.dtype)
        for kind, kv in zip(self.cfg.layer_kinds, self.kv_caches):
            h = self.backend.forward_decode(h, kv, kind, bs)
        return self.backend.forward_draft(h, self.kv_caches[-1], bs) if self.cfg.num_draft_tokens else h

    def forward_eager(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = q * self.rope_cos[positions][:, None, :].to(q.dtype)
        for kind, kv in zip(self.cfg.layer_kinds, self.kv_caches):
            h = self.backend.forward_decode_eager(h, kv, kind)
        return h


@dataclass
class BucketGraph:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor
    last_out: Optional[torch.Tensor] = None


class BucketGraphRunner:
    def __init__(self, model: DecodeModel, backend: AsyncFlashInferBackend, cfg: EngineConfig):
        self.model, self.backend, self.cfg = model, backend, cfg
        self.buckets = sorted(cfg.graph_buckets)
        rows = self.buckets[-1]
        self.static_q = torch.zeros(rows, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device=backend.device)
        self.static_positions = torch.zeros(rows, dtype=torch.int64, device=backend.device)
        self.graphs: dict[int, BucketGraph] = {}
        self.graph_out: dict[int, torch.Tensor] = {}
        self.pool = None

    def pick_bucket(self, n: int) -> int:
        return next(bs for bs in self.buckets if bs >= n)

    def record_all(self) -> None:
        assert not self.graphs, "graphs were already recorded"  # ok: FC109
        torch.cuda.synchronize()  # ok: FC101
        for bs in reversed(self.buckets):
            self.record_bucket(bs)

    def record_bucket(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        q, pos = self.static_q[:bs], self.static_positions[:bs]
        warm = self.model.forward_graph(q, pos, bs)
        torch.cuda.synchronize()  # ok: FC101
        if not torch.isfinite(warm).all():  # expect: FC101
            raise RuntimeError(f"non-finite warm-up output for bucket {bs}")
        self.graph_out[bs] = torch.empty_like(warm)  # ok: FC107
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            self.graph_out[bs].copy_(self.model.forward_graph(q, pos, bs))
        self.pool = g.pool()
        self.graphs[bs] = BucketGraph(graph=g, out=self.graph_out[bs])
        self.backend.kv_last_page_buf[:bs].fill_(1)  # expect: FC104

    async def replay(self, batch: ScheduledBatch, q: torch.Tensor) -> torch.Tensor:
        n = batch.batch_size
        assert q.shape[0] == n, "one query row per request"  # expect: FC109
        bs = self.pick_bucket(n)
        await self.backend.stage_bucket(bs, batch)
        self.static_q = torch.cat([q, self.static_q[n:]])  # expect: FC107
        if not torch.equal(self.static_positions[:n], batch.positions):  # expect: FC101
            self.static_positions[:n].copy_(batch.positions)  # ok: FC104
        entry = self.graphs[bs]
        entry.graph.replay()
        out = entry.out[: batch.qo_indptr[-1]]  # expect: FC101
        entry.last_out = out.clone()  # expect: FC107
        return entry.last_out
