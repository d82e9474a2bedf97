from __future__ import annotations

import logging
from collections import deque
from typing import Deque, List, Optional

import torch

import flashcheck
from semipd.config import SemiPDConfig
from semipd.controller import SMController
from semipd.kvpool.handoff import HandoffQueue
from semipd.kvpool.unified_pool import UnifiedKVPool
from semipd.model import SPDModel
from semipd.partition import PartitionedStreams, make_partitions
from semipd.workers.decode_graphs import DecodeGraphs
from semipd.workers.decode_worker import DecodeWorker
from semipd.workers.prefill_worker import PrefillWorker, PromptChunk

logger = logging.getLogger(__name__)


class SemiPDEngine:
    def __init__(self, cfg: SemiPDConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.total_sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        pf, dc = make_partitions(self.total_sms, cfg.prefill_sm_frac)
        self.streams = PartitionedStreams(self.device, pf, dc)
        self.pool = UnifiedKVPool(cfg.num_pages, cfg.page_size, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                  self.device)
        self.model = SPDModel(cfg, self.device)
        self.prefill = PrefillWorker(cfg, self.pool, self.model, self.device)
        self.decode = DecodeWorker(cfg, self.pool, self.model, self.device)
        self.graphs = DecodeGraphs(self.decode, self.streams.decode)
        self.handoff = HandoffQueue()
        self.controller = SMController(self)
        self.prefill_start = torch.cuda.Event(enable_timing=True)
        self.prefill_end = torch.cuda.Event(enable_timing=True)
        self.out_event = torch.cuda.Event()
        self.stats_event = torch.cuda.Event()
        self.waiting: Deque[PromptChunk] = deque()
        self.step_id = 0
        self.graphs.capture_all()

    def repartition(self, prefill_frac: float) -> None:
        torch.cuda.synchronize()
        pf, dc = make_partitions(self.total_sms, prefill_frac)
        self.streams = PartitionedStreams(self.device, pf, dc)
        self.graphs.stream = self.streams.decode
        self.graphs.capture_all()

    def _next_chunks(self) -> List[PromptChunk]:
        budget = self.cfg.max_prefill_tokens
        out: List[PromptChunk] = []
        while self.waiting and len(out) < self.cfg.max_prefill_reqs:
            c = self.waiting[0]
            if len(c.tokens) > budget:
                break
            budget -= len(c.tokens)
            out.append(self.waiting.popleft())
        return out

    @flashcheck.hot_path
    def step(self) -> Optional[torch.Tensor]:
        self.step_id += 1
        chunks = self._next_chunks()
        if chunks:
            with torch.cuda.stream(self.streams.prefill):
                self.prefill_start.record()
                for rec in self.prefill.run_chunk(chunks):
                    self.handoff.put(rec)
                self.prefill_end.record()

        for rec in self.handoff.drain():
            # the decode partition may read these pages only once the prefill partition wrote them
            self.streams.decode.wait_event(rec.kv_written)  # ok: FC101
            self.decode.admit(rec)

        out = None
        if self.decode.num_rows:
            with torch.cuda.stream(self.streams.decode):
                out = self.graphs.run_step()
                n = out.shape[0]
                self.decode.next_ids_cpu[:n].copy_(out, non_blocking=True)
                self.out_event.record()
                self.stats_event.record()
            self.decode.retire()

        if chunks and self.step_id % self.cfg.rebalance_every == 0:
            self.prefill_end.synchronize()  # expect: FC101
            self.controller.observe(self.prefill_start.elapsed_time(self.prefill_end))
        return out
