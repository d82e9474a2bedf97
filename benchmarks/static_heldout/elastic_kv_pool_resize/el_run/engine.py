"""The elastic engine: serve, and resize the pool between steps when usage moves."""

from __future__ import annotations

import logging
from typing import List

import numpy as np
import torch

from el_attn.backend import ElasticAttnBackend
from el_attn.rebind import GraphRebinder
from el_run.graphs import ElasticGraphRunner
from el_run.model import ElasticLM
from elastic import ElasticConfig, ElasticKVPool, ForwardBatch, Schedule, remap_page_tables

logger = logging.getLogger(__name__)


class ElasticEngine:
    def __init__(self, cfg: ElasticConfig, device_index: int = 0):
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        self.pool = ElasticKVPool(cfg, self.device, cfg.initial_pages)
        self.backend = ElasticAttnBackend(cfg, self.pool, self.device)
        self.model = ElasticLM(cfg, self.backend).to(self.device)
        self.runner = ElasticGraphRunner(cfg, self.model, self.backend, self.pool, self.device)
        self.rebinder = GraphRebinder(self.backend, self.runner, self.pool)
        self.page_tables: List[np.ndarray] = []
        self.max_pages_per_req = cfg.max_pages_per_req

    def start(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.runner.capture_one_batch_size(bs)

    def maybe_resize(self) -> None:
        usage = self.pool.usage()
        if self.pool.request_grow or usage > self.cfg.grow_watermark:
            target = min(self.cfg.max_pages, self.pool.num_pages + self.cfg.grow_granularity)
            if target > self.pool.num_pages:
                logger.info("growing KV pool %d -> %d pages", self.pool.num_pages, target)
                self.pool.grow(target)
                self.max_pages_per_req = min(self.cfg.max_context // self.cfg.page_size * 2,
                                             self.max_pages_per_req * 2)
                self.rebinder.after_grow(self.max_pages_per_req)
        elif usage < self.cfg.shrink_watermark and self.pool.num_pages > self.cfg.min_pages:
            target = max(self.cfg.min_pages, self.pool.num_pages - self.cfg.grow_granularity)
            logger.info("shrinking KV pool %d -> %d pages", self.pool.num_pages, target)
            mapping = self.pool.shrink(target)
            self.page_tables = remap_page_tables(self.page_tables, mapping)
            self.rebinder.after_shrink(mapping)

    def step(self, sched: Schedule) -> torch.Tensor:
        self.maybe_resize()
        batch = ForwardBatch.from_schedule(sched, self.cfg.page_size, self.device)
        self.backend.init_forward_metadata(batch)
        if batch.num_prefill:
            last_rows = torch.from_numpy(np.cumsum(sched.query_lens) - 1).to(self.device, non_blocking=True)
            logits = self.model.prefill(batch.input_ids, batch.positions, self.pool.kv_cache, last_rows)
        else:
            bucket = self.runner.bucket_for(batch.batch_size)
            if bucket is not None:
                logits = self.runner.replay(bucket, batch)
            else:
                logits = self.model.decode(batch.input_ids, batch.positions, self.pool.kv_cache, batch.batch_size)
        return torch.argmax(logits, dim=-1)
