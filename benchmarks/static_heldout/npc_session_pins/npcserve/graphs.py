"""Decode graphs, one per bucket, all reading the backend's shared page table."""
from __future__ import annotations

import bisect
import logging
from typing import Dict, Optional

import torch

logger = logging.getLogger(__name__)


class NPCGraphRunner:
    def __init__(self, cfg, model, backend):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.device = backend.device
        self.buckets = sorted(cfg.bucket_sizes)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_logits: Dict[int, torch.Tensor] = {}
        self.static_emotes: Dict[int, torch.Tensor] = {}
        n = self.buckets[-1]
        self.static_input_ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.static_positions = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.static_persona_bias = torch.zeros(n, cfg.hidden_size, dtype=torch.bfloat16, device=self.device)
        self.graph_workspace = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC106
        self.pool = None
        self.pages_touched = 0

    def _bucket_for(self, bs: int) -> int:
        return self.buckets[bisect.bisect_left(self.buckets, bs)]

    def capture_all(self) -> None:
        if self.backend._kv_layout != "NHD":  # ok: FC103
            raise NotImplementedError("graphs are captured for the NHD cache layout only")
        self.backend.init_graph_buffers()
        for bucket in reversed(self.buckets):
            self.capture_bucket(bucket)

    def capture_bucket(self, bucket: int) -> None:
        self.backend.make_graph_wrapper(bucket, self.graph_workspace)
        self.backend.plan_graph_decode(bucket, self._dummy_rows(bucket))
        torch.cuda.synchronize()  # ok: FC101
        warm_pages = int(self.backend.kv_indptr[bucket])  # expect: FC101
        if warm_pages == 0:
            logger.warning("bucket %d captured over an empty page table", bucket)
        for _ in range(2):
            self.model.forward_decode(self.static_input_ids[:bucket], self.static_positions[:bucket], bucket)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits, emotes = self.model.forward_decode(self.static_input_ids[:bucket], self.static_positions[:bucket], bucket)
        self.pool = g.pool()
        self.graphs[bucket] = g
        self.static_logits[bucket] = logits
        self.static_emotes[bucket] = emotes

    def _dummy_rows(self, bucket: int):
        import numpy as np

        return np.zeros(0, dtype=np.int64) if not self.backend.table.by_row else np.asarray(
            sorted(self.backend.table.by_row)[:bucket], dtype=np.int64)

    def run(self, batch):
        if batch.size <= self.cfg.graph_max_bs and self.graphs:
            return self.replay(batch)
        self.backend.plan_eager_decode(batch)
        logits, emotes = self.model.forward_decode(batch.input_ids, batch.positions)
        return logits, emotes

    def replay(self, batch):
        bucket = self._bucket_for(batch.size)
        if self.cfg.trace_ticks:
            logger.info(f"replay bucket={bucket} seq_lens={batch.seq_lens_device}")  # expect: FC101
        self.backend.plan_graph_decode(bucket, batch.rows)
        self.backend.plan_persona_recall(batch.rows)
        self.pages_touched += int(self.backend.kv_indptr_host[batch.size])  # ok: FC101
        self.static_input_ids[: batch.size].copy_(batch.input_ids)
        self.static_positions[: batch.size].copy_(batch.positions)
        if batch.persona_bias is not None:
            self.static_persona_bias = batch.persona_bias.clone()  # expect: FC107
        self.graphs[bucket].replay()
        return self.static_logits[bucket][: batch.size], self.static_emotes[bucket][: batch.size]
