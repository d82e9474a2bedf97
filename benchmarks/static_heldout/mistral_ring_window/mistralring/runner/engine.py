"""The engine loop: admission and prefill, then decode by graph replay or eagerly."""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Callable, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from mistralring.attn.backend import PrefillChunk, RingWindowBackend
from mistralring.config import MistralRingConfig
from mistralring.model import MistralRingModel
from mistralring.ring_cache import RingBatch, RingKVCache
from mistralring.runner.graph_runner import DecodeGraphRunner

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Request:
    req_id: str
    prompt_ids: List[int]
    max_new_tokens: int
    slot: int = -1
    output_ids: List[int] = dataclasses.field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclasses.dataclass
class StepOutput:
    requests: List[Request]
    num_rows: int
    done: torch.cuda.Event


def _indptr(counts: Sequence[int]) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(counts)]), dtype=torch.int32)


class MistralEngine:
    def __init__(self, cfg: MistralRingConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.cache = RingKVCache(cfg, self.device)
        self.backend = RingWindowBackend(cfg, self.cache, self.device)
        self.model = MistralRingModel(cfg, self.backend, self.cache).to(self.device)
        self.backend.init_graph_wrappers()
        self.graph_runner = DecodeGraphRunner(cfg, self.model, self.backend, self.cache, self.device)
        self.graph_runner.record_buckets()
        self.waiting: Deque[Request] = collections.deque()
        self.running: List[Request] = []
        self.last_tokens = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=self.device)
        self.next_ids_host = torch.zeros(cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
        self._prev_slots: List[int] = []

    # --------------------------------------------------------------- intake
    def add_request(self, req_id: str, prompt_ids: Sequence[int], max_new_tokens: int = 256) -> None:
        assert len(prompt_ids) + max_new_tokens <= self.cfg.max_context_len, "request exceeds the context"  # expect: FC109
        self.waiting.append(Request(req_id, list(prompt_ids), max_new_tokens))

    def _prefill(self, reqs: List[Request]) -> None:
        """Prompt pass of newly admitted requests (the scheduler chunks prompts longer than the window)."""
        cfg = self.cfg
        P, R, C = cfg.page_size, cfg.ring_pages, cfg.max_context_pages
        qo, ring_counts, ring_ind, ring_last = [], [], [], []
        glob_counts, glob_ind = [], []
        ids, pos, ring_page, ring_off, glob_page, glob_off = [], [], [], [], [], []
        slots = []
        for req in reqs:
            n = len(req.prompt_ids)
            req.slot = self.cache.admit(n)
            slots.append(req.slot)
            pages = -(-n // P)
            live = min(pages, R)
            oldest = self.cache.oldest_page(req.slot)
            head = oldest - req.slot * R
            qo.append(n)
            ring_counts.append(live)
            ring_ind.extend(req.slot * R + (head + i) % R for i in range(live))
            ring_last.append((n - 1) % P + 1)
            glob_counts.append(pages)
            glob_ind.extend(range(req.slot * C, req.slot * C + pages))
            ids.extend(req.prompt_ids)
            pos.extend(range(n))
            ring_page.extend(req.slot * R + (t // P) % R for t in range(n))
            ring_off.extend(t % P for t in range(n))
            glob_page.extend(req.slot * C + t // P for t in range(n))
            glob_off.extend(t % P for t in range(n))

        def dev(xs, dtype=torch.int64):
            return torch.tensor(xs, dtype=dtype).to(self.device, non_blocking=True)

        chunk = PrefillChunk(
            qo_indptr_cpu=_indptr(qo), ring_indptr_cpu=_indptr(ring_counts), ring_indices=dev(ring_ind, torch.int32),
            ring_last_page_len_cpu=torch.tensor(ring_last, dtype=torch.int32),
            global_indptr_cpu=_indptr(glob_counts), global_indices=dev(glob_ind, torch.int32),
            global_last_page_len_cpu=torch.tensor([(n - 1) % P + 1 for n in qo], dtype=torch.int32),
        )
        self.backend.plan_prefill(chunk)
        logits = self.model.prefill(dev(ids), dev(pos), dev(ring_page), dev(ring_off), dev(glob_page), dev(glob_off))
        last_rows = dev((np.cumsum(qo) - 1).tolist())
        self.last_tokens[dev(slots)] = torch.argmax(logits[last_rows], dim=-1)

    # ----------------------------------------------------------------- step
    def _decode_batch(self) -> RingBatch:
        P, R = self.cfg.page_size, self.cfg.ring_pages
        lens_cpu = torch.tensor([r.seq_len + 1 for r in self.running], dtype=torch.int32)
        req_slots = torch.tensor([r.slot for r in self.running], dtype=torch.int64).to(self.device, non_blocking=True)
        seq_lens = lens_cpu.to(self.device, non_blocking=True)
        counts = torch.clamp((seq_lens + P - 1) // P, max=R).to(torch.int32)
        return RingBatch(req_slots=req_slots, seq_lens=seq_lens, seq_lens_cpu=lens_cpu, kv_page_counts=counts)

    def _rings_full(self, batch: RingBatch) -> bool:
        P, R = self.cfg.page_size, self.cfg.ring_pages
        return bool(((batch.seq_lens_cpu + P - 1) // P >= R).all())  # ok: FC101

    def step(self) -> Optional[StepOutput]:
        admitted: List[Request] = []
        while self.waiting and len(self.running) + len(admitted) < self.cfg.max_batch_size:
            admitted.append(self.waiting.popleft())
        if admitted:
            self._prefill(admitted)
            self.running.extend(admitted)
        if not self.running:
            return None

        batch = self._decode_batch()
        n = batch.batch_size
        input_ids = self.last_tokens[batch.req_slots]
        positions = (batch.seq_lens - 1).long()
        wrapped = self.cache.advance(batch)
        bs = self.graph_runner.bucket_for(n)
        slots_now = [r.slot for r in self.running]
        if bs is None:
            self.backend.init_forward_metadata(batch)
            logits = self.model(input_ids, positions, batch)
        else:
            reuse = slots_now == self._prev_slots and self._rings_full(batch)
            if reuse:
                self.cache.rotate_heads(batch)
                self.backend.refresh_bound_table(batch, wrapped)
            logits = self.graph_runner.replay(batch, input_ids, positions, bs, reuse_plan=reuse)
        self._prev_slots = slots_now

        next_ids = torch.argmax(logits, dim=-1)
        self.last_tokens[batch.req_slots] = next_ids
        done = torch.cuda.Event()
        self.next_ids_host[:n].copy_(next_ids, non_blocking=True)  # ok: FC101
        done.record()
        return StepOutput(list(self.running), n, done)

    # ------------------------------------------------------------- outputs
    def collect(self, out: StepOutput) -> Dict[str, List[int]]:
        out.done.synchronize()
        next_ids = self.next_ids_host[: out.num_rows].tolist()
        finished: Dict[str, List[int]] = {}
        for req, tok in zip(out.requests, next_ids):
            req.output_ids.append(tok)
            if len(req.output_ids) >= req.max_new_tokens:
                finished[req.req_id] = req.output_ids
                self.cache.release(req.slot)
                self.running.remove(req)
        return finished

    def report_stats(self) -> Dict[str, float]:
        wrapped = (self.cache.ring_head > 0).float().mean().item()  # ok: FC101
        return {"running": float(len(self.running)), "waiting": float(len(self.waiting)),
                "wrapped_ring_fraction": wrapped, "eager_steps": float(self.backend.stats["steps"])}

    def serve_forever(self, poll: Callable[[], Iterable[Tuple[str, List[int], int]]]) -> None:
        while True:
            for req_id, prompt, max_new in poll():
                self.add_request(req_id, prompt, max_new)
            out = self.step()
            if out is not None:
                for req_id, tokens in self.collect(out).items():
                    logger.info("finished %s with %d tokens", req_id, len(tokens))
