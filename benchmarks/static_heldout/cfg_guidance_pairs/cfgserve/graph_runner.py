from __future__ import annotations

import bisect
import logging
from typing import Optional

import torch

from cfgserve.attention.backend import PairAttnBackend
from cfgserve.batch import DecodeBatch
from cfgserve.config import GenConfig
from cfgserve.model import ImageARModel
from cfgserve.sampling.cfg import CFGSampler

logger = logging.getLogger(__name__)


class PairGraphRunner:
    """One graph per pair bucket: decode of 2 * bs rows, image head and guidance mix."""

    def __init__(self, cfg: GenConfig, model: ImageARModel, backend: PairAttnBackend, sampler: CFGSampler):
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.sampler = sampler
        self.buckets = sorted(cfg.graph_pairs)
        rows = 2 * cfg.max_pairs
        self.device = torch.device(cfg.device)
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self.slot_mapping = torch.full((rows,), -1, dtype=torch.int64, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.guided: dict[int, torch.Tensor] = {}
        self.pool = None

    def bucket(self, num_pairs: int) -> Optional[int]:
        i = bisect.bisect_left(self.buckets, num_pairs)
        return self.buckets[i] if i < len(self.buckets) else None

    def record(self, bs: int) -> None:
        b = self.backend
        b.make_graph_wrapper(bs)
        meta = b.plan_dummy_pairs(bs, self.slot_mapping[: 2 * bs])
        logger.info("recording %d pairs (dummy rows hold %d pages)", bs, b.cond_kv_indptr[bs].item())  # expect: FC101
        ids, pos = self.input_ids[: 2 * bs], self.positions[: 2 * bs]
        hidden = self.model.decode(ids, pos, meta)  # warm-up outside the graph
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            hidden = self.model.decode(ids, pos, meta)
            logits = self.model.image_logits(hidden)
            guided = self.sampler.mix(logits, bs)
        if self.pool is None:
            self.pool = g.pool()
        self.graphs[bs], self.logits[bs], self.guided[bs] = g, logits, guided

    def record_all(self) -> None:
        for bs in reversed(self.buckets):
            self.record(bs)

    def replay(self, bs: int, batch: DecodeBatch) -> tuple[torch.Tensor, torch.Tensor]:
        n = batch.num_pairs
        self.input_ids[:n].copy_(batch.cond_input_ids)
        self.input_ids[bs: bs + n].copy_(batch.uncond_input_ids)
        self.positions = torch.cat([batch.cond_positions, batch.uncond_positions])  # expect: FC107
        self.slot_mapping[: 2 * n].copy_(batch.slot_mapping)
        self.graphs[bs].replay()
        return self.logits[bs], self.guided[bs]
