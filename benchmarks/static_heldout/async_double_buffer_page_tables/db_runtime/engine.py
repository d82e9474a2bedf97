"""The engine: replay from one buffer set while the stager fills the other."""

from __future__ import annotations

import logging
from typing import List, Optional

import torch

from db_attn.backend import DecodeContext, DoubleBufferAttnBackend
from db_runtime.builder import ScheduledBatch, StepInputBuilder
from db_runtime.graphs import SlotGraphRunner
from db_runtime.model import TinyLM
from dbuf import DoubleBufferConfig, PageTableStager

logger = logging.getLogger(__name__)


class DoubleBufferEngine:
    def __init__(self, cfg: DoubleBufferConfig, device_index: int = 0):
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        self.backend = DoubleBufferAttnBackend(cfg, self.device)
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=self.device,
        )
        self.model = TinyLM(cfg, self.backend).to(self.device)
        self.runner = SlotGraphRunner(cfg, self.model, self.backend, self.kv_cache, self.device)
        self.stager = PageTableStager(cfg, self.backend.buffer_sets, self.device)
        self.builder = StepInputBuilder(cfg, self.device)
        self.out_host = [torch.zeros(cfg.max_batch, dtype=torch.long, pin_memory=True) for _ in range(2)]
        self.out_ready = [torch.cuda.Event() for _ in range(2)]
        self.out_count = [0, 0]
        self.cursor = 0

    def start(self) -> None:
        self.runner.capture_all()

    def step(self, sched: ScheduledBatch, next_sched: Optional[ScheduledBatch]) -> int:
        slot = self.cursor
        batch = self.builder.build(sched)
        bs = batch.batch_size
        if batch.num_prefill:
            self.backend.plan_prefill(batch)
            logits = self.model.prefill(batch.input_ids, batch.positions, self.kv_cache, batch.qo_indptr)
        else:
            max_len = int(batch.seq_lens.max())  # expect: FC101
            bucket = self.runner.bucket_for(bs)
            long_rows = max_len > self.cfg.long_row_threshold
            if bucket is None or long_rows:
                if long_rows:
                    self.backend.plan_long_decode(batch)
                else:
                    self.backend.plan_short_decode(batch)
                ctx = DecodeContext(slot=slot, bs=bs, graph=False, long_rows=long_rows)
                logits = self.model.decode(batch.input_ids, batch.positions, self.kv_cache, ctx)
            else:
                logits = self.runner.replay(slot, bucket, bs, batch.input_ids, batch.positions, batch.seq_lens)

        next_tokens = torch.argmax(logits, dim=-1)
        n = next_tokens.shape[0]
        self.out_host[slot][:n].copy_(next_tokens, non_blocking=True)  # ok: FC101
        self.out_ready[slot].record()
        self.out_count[slot] = n

        if next_sched is not None:
            self.stager.stage_next(slot ^ 1, next_sched.page_tables, next_sched.seq_lens)
        self.cursor = slot ^ 1
        return slot

    def collect(self, slot: int) -> List[int]:
        # called by the detokenizer thread, one step behind
        self.out_ready[slot].synchronize()
        return self.out_host[slot][: self.out_count[slot]].tolist()

    def debug_summary(self) -> dict:
        return self.runner.describe()
