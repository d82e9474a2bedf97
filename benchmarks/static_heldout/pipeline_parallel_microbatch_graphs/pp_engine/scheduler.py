"""Host-side scheduling: admission, chunked prefill and page allocation for one pipeline."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional

import numpy as np

from ppserve.config import PipelineConfig
from ppserve.microbatch import Request, ScheduledBatch


@dataclass
class SeqState:
    req_id: int
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = field(default_factory=list)
    num_computed: int = 0
    page_ids: List[int] = field(default_factory=list)
    maybe_finished: bool = False

    @property
    def total_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


class PageAllocator:
    def __init__(self, num_pages: int):
        self._free: List[int] = list(range(num_pages - 1, 0, -1))  # page 0 is the null page

    def alloc(self, n: int) -> Optional[List[int]]:
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def free(self, pages: List[int]) -> None:
        self._free.extend(reversed(pages))

    @property
    def num_free(self) -> int:
        return len(self._free)


class Scheduler:
    def __init__(self, cfg: PipelineConfig):
        self.cfg = cfg
        self.pages = PageAllocator(cfg.num_pages_per_stage)
        self.waiting: Deque[SeqState] = deque()
        self.running: Dict[int, SeqState] = {}
        self.step_id = 0

    def add_request(self, req_id: int, prompt_ids: List[int], max_new_tokens: int) -> None:
        if not prompt_ids:
            raise ValueError(f"request {req_id}: empty prompt")
        self.waiting.append(SeqState(req_id, list(prompt_ids), max_new_tokens))

    def _grow_pages(self, seq: SeqState, new_len: int) -> bool:
        need = (new_len + self.cfg.page_size - 1) // self.cfg.page_size - len(seq.page_ids)
        if need <= 0:
            return True
        got = self.pages.alloc(need)
        if got is None:
            return False
        seq.page_ids.extend(got)
        return True

    def schedule(self) -> Optional[ScheduledBatch]:
        budget = self.cfg.max_num_batched_tokens
        reqs: List[Request] = []
        ids: List[int] = []
        for seq in list(self.running.values()):
            if len(reqs) >= self.cfg.max_num_seqs or budget <= 0:
                break
            prompt_left = len(seq.prompt_ids) - seq.num_computed
            n_new = min(prompt_left, budget) if prompt_left > 0 else 1
            if not self._grow_pages(seq, seq.num_computed + n_new):
                continue
            src = seq.prompt_ids + seq.output_ids
            reqs.append(Request(seq.req_id, len(seq.prompt_ids), seq.num_computed, n_new,
                                list(seq.page_ids), token_offset=len(ids)))
            ids.extend(src[seq.num_computed: seq.num_computed + n_new])
            budget -= n_new
        while self.waiting and budget > 0 and len(reqs) < self.cfg.max_num_seqs:
            seq = self.waiting[0]
            n_new = min(len(seq.prompt_ids), budget)
            if not self._grow_pages(seq, n_new):
                break
            self.waiting.popleft()
            self.running[seq.req_id] = seq
            reqs.append(Request(seq.req_id, len(seq.prompt_ids), 0, n_new, list(seq.page_ids), token_offset=len(ids)))
            ids.extend(seq.prompt_ids[:n_new])
            budget -= n_new
        if not reqs:
            return None
        self.step_id += 1
        return ScheduledBatch(self.step_id, reqs, np.asarray(ids, dtype=np.int64), self.cfg.page_size)

    def advance(self, batch: ScheduledBatch) -> None:
        for r in batch.requests:
            seq = self.running.get(r.req_id)
            if seq is not None:
                seq.num_computed += r.num_new

    def check_stops(self, req_ids: List[int]) -> None:
        for rid in req_ids:
            seq = self.running.get(rid)
            if seq is not None:
                seq.maybe_finished = True

    def finish(self, req_id: int) -> None:
        seq = self.running.pop(req_id, None)
        if seq is not None:
            self.pages.free(seq.page_ids)
