"""The per-rank engine loop: schedule, split into microbatches, run this rank's stage."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from ppserve.comm import MicrobatchChannel
from ppserve.config import PipelineConfig
from ppserve.microbatch import Microbatch, split_batch
from pp_engine.scheduler import Scheduler
from pp_stage.worker import StageWorker

logger = logging.getLogger(__name__)


@dataclass
class RingSlot:
    tokens_host: torch.Tensor
    event: torch.cuda.Event
    req_ids: List[int] = field(default_factory=list)


class TokenRing:
    """Sampled tokens land in pinned slots; an output thread reads them once their event fired."""

    def __init__(self, depth: int, max_bs: int):
        self._slots = [
            RingSlot(torch.empty(max_bs, dtype=torch.int64, pin_memory=True), torch.cuda.Event())
            for _ in range(depth)
        ]
        self._head = 0
        self._tail = 0
        self._cv = threading.Condition()

    def push(self, mb: Microbatch, tokens: torch.Tensor) -> None:
        slot = self._slots[self._head % len(self._slots)]
        slot.tokens_host[: mb.bs].copy_(tokens, non_blocking=True)
        slot.event.record()
        slot.req_ids = list(mb.req_ids)
        with self._cv:
            self._head += 1
            self._cv.notify()

    def drain(self) -> Dict[int, int]:
        with self._cv:
            while self._tail == self._head:
                self._cv.wait()
            slot = self._slots[self._tail % len(self._slots)]
            self._tail += 1
        slot.event.synchronize()
        return dict(zip(slot.req_ids, slot.tokens_host[: len(slot.req_ids)].tolist()))


class PipelineEngine:
    def __init__(self, cfg: PipelineConfig, stage_id: int, device, group=None):
        self.cfg = cfg
        self.device = torch.device(device)
        specs = cfg.stage_specs()
        spec = specs[stage_id]
        max_tokens = cfg.max_num_batched_tokens
        recv = None
        send = None
        if stage_id > 0:
            recv = MicrobatchChannel(specs[stage_id - 1].rank, spec.rank, cfg.hidden_size, max_tokens,
                                     cfg.dtype, self.device, group)
        if stage_id < cfg.num_stages - 1:
            send = MicrobatchChannel(spec.rank, specs[stage_id + 1].rank, cfg.hidden_size, max_tokens,
                                     cfg.dtype, self.device, group)
        self.worker = StageWorker(cfg, spec, self.device, recv, send)
        self.scheduler = Scheduler(cfg)
        self.ring = TokenRing(depth=2 * cfg.num_microbatches, max_bs=cfg.max_num_seqs)
        self.eos_token_id = cfg.eos_token_id

    def start(self) -> None:
        self.worker.init_graphs()

    def step(self) -> int:
        batch = self.scheduler.schedule()
        if batch is None:
            return 0
        n_mb = min(self.cfg.num_microbatches, len(batch.requests))
        for mb in split_batch(batch, n_mb, self.device):
            logits = self.worker.run_microbatch(mb)
            if logits is not None:
                self._finish(mb, logits)
        self.scheduler.advance(batch)
        return len(batch.requests)

    def _finish(self, mb: Microbatch, logits: torch.Tensor) -> None:
        next_tokens = torch.argmax(logits, dim=-1)
        self.ring.push(mb, next_tokens)
        hit_eos = next_tokens == self.eos_token_id
        if hit_eos.any():  # expect: FC101
            self.scheduler.check_stops(mb.req_ids)
        logger.debug("microbatch %d sampled %s", mb.mb_id, next_tokens)  # ok: FC101

    def debug_dump(self) -> Optional[Dict[str, List[float]]]:
        if not self.worker.graphs.records:
            return None
        return self.worker.graphs.replay_debug_stats()
