from __future__ import annotations

import logging
from typing import Dict, List

import numpy as np
import torch

from hotkv.backend import HotPageAttnBackend
from hotkv.model import HotDecoder

logger = logging.getLogger(__name__)


class HotGraphRunner:
    def __init__(self, model: HotDecoder, backend: HotPageAttnBackend, hot_kv: torch.Tensor,
                 ring_kv: torch.Tensor, batch_sizes: List[int], device: torch.device):
        self.model = model
        self.backend = backend
        self.hot_kv = hot_kv
        self.ring_kv = ring_kv
        self.batch_sizes = sorted(batch_sizes)
        self.device = device
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: Dict[int, torch.Tensor] = {}
        self.input_ids = torch.zeros(self.batch_sizes[-1], dtype=torch.int64, device=device)
        self._fixed_batch_size = 0

    def record(self) -> None:
        self.backend.init_graph_buffers()
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.batch_sizes):
            self.backend.make_graph_wrapper(bs)
            rows = [np.zeros(1, dtype=np.int32) for _ in range(bs)]
            self.backend.graph_bs = bs
            self.backend.graph_wrappers[bs].plan(
                torch.arange(bs + 1, dtype=torch.int32), self.backend.hot_indices[:bs],
                self.backend.full_last_cpu[:bs], self.backend.num_qo_heads, self.backend.num_kv_heads,
                self.backend.head_dim, self.backend.page_size,
            )
            self.backend._plan_ring(bs, np.ones(bs, dtype=np.int32))
            self.model(self.input_ids[:bs], self.hot_kv, self.ring_kv, bs)
            torch.cuda.synchronize()  # ok: FC101
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self.logits[bs] = self.model(self.input_ids[:bs], self.hot_kv, self.ring_kv, bs)
            self.graphs[bs] = g
            self._fixed_batch_size = max(self._fixed_batch_size, bs)  # ok: FC103
        logger.info("recorded %d hot-page decode graphs", len(self.graphs))

    def bucket(self, n: int) -> int:
        for bs in self.batch_sizes:
            if bs >= n:
                return bs
        return -1

    def run(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        n = input_ids.shape[0]
        self.input_ids[:n].copy_(input_ids)
        self.graphs[bs].replay()
        return self.logits[bs][:n]
