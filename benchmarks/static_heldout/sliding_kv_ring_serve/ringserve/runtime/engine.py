"""The decode loop: advance rings, recompute page tables, replay or run eagerly, sample."""

from __future__ import annotations

import collections
import contextlib
import logging
from dataclasses import dataclass
from typing import Deque, Iterator, List, Optional, Tuple

import torch

import flashcheck
from ringserve.attn.base import ForwardBatch
from ringserve.attn.flashinfer_ring import FlashInferRingBackend
from ringserve.attn.registry import make_backend
from ringserve.config import RingConfig
from ringserve.ring.ring_cache import RingKVCache
from ringserve.runtime.graph_runner import RingGraphRunner
from ringserve.runtime.model import SlidingWindowLM
from ringserve.runtime.scheduler import Request, RingScheduler
from ringserve.utils import ring_window_positions

logger = logging.getLogger(__name__)


@dataclass
class StepResult:
    batch: ForwardBatch
    event: torch.cuda.Event
    num_stopped: int


class RingEngine:
    def __init__(self, cfg: RingConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.cache = RingKVCache(cfg, self.device)
        self.backend: FlashInferRingBackend = make_backend(cfg.attn_backend, cfg, self.cache, self.device)
        self.model = SlidingWindowLM(cfg, self.cache, self.backend).to(self.device)
        self.graph_runner = RingGraphRunner(self.model, self.backend, self.cache, cfg, self.device)
        self.scheduler = RingScheduler(cfg, self.cache, self.device)
        self.eos_ids_gpu = torch.tensor([cfg.eos_token_id], dtype=torch.int64, device=self.device)
        self.tokens_pinned = torch.zeros(cfg.max_requests, dtype=torch.int64, pin_memory=True)
        self.copy_event = torch.cuda.Event()
        self.side_stream = torch.cuda.Stream(self.device)
        self.overlap = True
        self._pending: Deque[StepResult] = collections.deque()
        self.cache.on_evict = lambda slot: self.backend.release_slot(slot)
        if cfg.attn_backend == "flashinfer":
            self.graph_runner.capture_all()

    def submit(self, rid: str, prompt_ids: List[int], max_new_tokens: int) -> None:
        self.scheduler.admit(Request(rid=rid, prompt_ids=list(prompt_ids), max_new_tokens=max_new_tokens))

    @torch.inference_mode()
    def prefill_waiting(self) -> Optional[torch.Tensor]:
        if (batch := self.scheduler.next_extend_batch()) is None:
            return None
        self.backend.init_forward_metadata(batch)
        last_idx = torch.tensor(batch.extend_indptr_np[1:] - 1, dtype=torch.int64).to(self.device, non_blocking=True)
        return torch.argmax(self.model.forward_extend(batch.input_ids_gpu, batch.positions_gpu, batch.out_loc_gpu, last_idx), dim=-1)

    @flashcheck.hot_path
    @torch.inference_mode()
    def step(self) -> Optional[StepResult]:
        batch = self.scheduler.next_decode_batch()
        if batch is None:
            return None
        bs = batch.batch_size
        wrapped_np = self.cache.advance(batch.slots_np)
        if wrapped_np.any():
            flat_pos, new_pages = self.cache.wrapped_positions(batch.slots_np, wrapped_np)
            self.backend.on_ring_wrap(flat_pos, new_pages)
        batch.positions_gpu = ring_window_positions(batch.seq_lens_gpu, self.cfg.window)[:, -1]
        ctx = torch.cuda.stream(self.side_stream) if self.overlap else contextlib.nullcontext()
        with ctx:
            if bs <= self.cfg.max_graph_bs and self.graph_runner.graphs:
                logits = self.graph_runner.replay(batch)
            elif self.cfg.use_trtllm_for_large:
                logits = self.model.forward_decode_large(batch)
            else:
                self.backend.init_forward_metadata(batch)
                logits = self.model.forward_decode(batch.input_ids_gpu, batch.positions_gpu, batch.out_loc_gpu)
        next_tokens = torch.argmax(logits, dim=-1)
        stop_hits = next_tokens == self.eos_ids_gpu
        num_stopped = int(stop_hits.sum())  # expect: FC101
        logger.debug("step bs=%d stopped=%d tokens=%s", bs, num_stopped, next_tokens)  # ok: FC101
        self.tokens_pinned[:bs].copy_(next_tokens, non_blocking=True)
        self.copy_event.record()
        self._pending.append(res := StepResult(batch=batch, event=self.copy_event, num_stopped=num_stopped))
        return res

    def drain(self) -> Iterator[Tuple[str, int]]:
        while self._pending:
            res = self._pending.popleft()
            res.event.synchronize()
            toks = self.tokens_pinned[: res.batch.batch_size].tolist()
            self.scheduler.on_tokens(res.batch.request_ids, toks)
            yield from zip(res.batch.request_ids, toks)

    def serve_forever(self) -> Iterator[Tuple[str, int]]:
        while True:
            prefilled = self.prefill_waiting() is not None
            if self.step() is None and not prefilled:
                return
            yield from self.drain()
