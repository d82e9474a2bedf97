"""Per-bucket CUDA graph capture and replay inside a worker process."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from .backends.base import AttentionBackend
from .batch import StepInputs
from .config import EngineConfig


class GraphRunner:
    def __init__(
        self,
        backend: AttentionBackend,
        cfg: EngineConfig,
        kv_cache: torch.Tensor,
        device: torch.device,
    ) -> None:
        self.backend = backend
        self.cfg = cfg
        self.kv_cache = kv_cache
        self.device = device
        self.buckets = sorted(cfg.graph_buckets)
        max_bs = self.buckets[-1] if self.buckets else 0
        self.static_q = torch.zeros(
            max_bs, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device=device
        )
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.pool: Optional[tuple] = None

    def has_bucket(self, bs: int) -> bool:
        return bs in self.graphs

    def record_all(self) -> None:
        self.backend.init_cuda_graph_state(self.buckets)
        # largest first so the smaller graphs reuse its pool
        for bs in reversed(self.buckets):
            self._record(bs)

    def _record(self, bs: int) -> None:
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        q = self.static_q[:bs]
        for _ in range(2):
            self.backend.forward_decode(q, self.kv_cache, bs)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.backend.forward_decode(q, self.kv_cache, bs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs] = g
        self.outputs[bs] = out

    def replay(self, bs: int, batch: StepInputs, q: torch.Tensor) -> torch.Tensor:
        self.backend.init_forward_metadata_replay_cuda_graph(bs, batch)
        # pad the step's queries to the bucket's captured input
        self.static_q = torch.cat([q, self.static_q[q.shape[0]:]])  # expect: FC107
        self.graphs[bs].replay()
        return self.outputs[bs][: batch.batch_size]
