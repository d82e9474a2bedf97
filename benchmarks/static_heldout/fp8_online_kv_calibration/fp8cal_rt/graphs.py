"""Decode graphs, recorded once the scales are frozen."""
from __future__ import annotations

import logging
from typing import Dict, Optional

import torch

from fp8cal.attn.backend import Fp8DecodeBackend
from fp8cal.batch import DecodeBatch
from fp8cal.kv.cache import Fp8PagedKVCache
from fp8cal.settings import CalibSettings
from fp8cal_rt.model import Fp8Model

logger = logging.getLogger(__name__)


class Fp8GraphRunner:
    def __init__(
        self,
        s: CalibSettings,
        model: Fp8Model,
        backend: Fp8DecodeBackend,
        cache: Fp8PagedKVCache,
        device: torch.device,
    ):
        self.s = s
        self.model = model
        self.backend = backend
        self.cache = cache
        rows = max(s.graph_buckets)
        self.static_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.static_pos = torch.zeros(rows, dtype=torch.long, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = None

    def bucket_for(self, bs: int) -> Optional[int]:
        for b in sorted(self.s.graph_buckets):
            if b >= bs:
                return b
        return None

    def capture_all(self) -> None:
        self.backend.init_graph_buffers()
        for bs in sorted(self.s.graph_buckets, reverse=True):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        self.backend.warm_bucket(bs)
        widest = self.cache.k_scale.max().item()  # expect: FC101
        logger.info("recording bucket %d (widest K scale %.5f)", bs, widest)
        torch.cuda.current_stream().synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self.model.decode_graph(self.static_ids[:bs], self.static_pos[:bs], bs)
        self.mempool = graph.pool()
        self.graphs[bs] = graph
        self.outputs[bs] = out

    def replay_bucket(self, batch: DecodeBatch, padded: int) -> torch.Tensor:
        bs = batch.num_rows
        self.static_ids[:bs].copy_(batch.input_ids)
        self.static_pos[:bs].copy_(batch.positions)
        self.static_ids[bs:padded].zero_()
        self.static_pos[bs:padded].zero_()
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
