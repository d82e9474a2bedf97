"""Token-budget scheduling: decodes first, then chunks of running prefills, then admissions."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import numpy as np

from cpbp.config import PAGE_SIZE, SchedulerConfig


@dataclass
class Request:
    rid: int
    prompt: List[int]
    max_new_tokens: int
    num_computed: int = 0
    output: List[int] = field(default_factory=list)
    pages: List[int] = field(default_factory=list)
    # offset of this request's pages in the last graph replay's indices, if it was replayed
    graph_offset: Optional[int] = None

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < len(self.prompt)

    def finished(self, eos_id: int) -> bool:
        return len(self.output) >= self.max_new_tokens or (bool(self.output) and self.output[-1] == eos_id)

    def token_at(self, pos: int) -> int:
        return self.prompt[pos] if pos < len(self.prompt) else self.output[pos - len(self.prompt)]


class PageAllocator:
    def __init__(self, num_pages: int):
        self.free: Deque[int] = deque(range(1, num_pages))  # page 0 is the null page

    def alloc(self, n: int) -> List[int]:
        return [self.free.popleft() for _ in range(n)]

    def release(self, pages: List[int]) -> None:
        self.free.extend(pages)


@dataclass
class ScheduledRow:
    req: Request
    num_new_tokens: int

    @property
    def seq_len_after(self) -> int:
        return self.req.num_computed + self.num_new_tokens


@dataclass
class StepPlan:
    rows: List[ScheduledRow]
    num_decodes: int

    @property
    def num_prefills(self) -> int:
        return len(self.rows) - self.num_decodes

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.rows)

    def query_lens_np(self) -> np.ndarray:
        return np.array([r.num_new_tokens for r in self.rows], dtype=np.int32)

    def seq_lens_np(self) -> np.ndarray:
        return np.array([r.seq_len_after for r in self.rows], dtype=np.int32)


class TokenBudgetScheduler:
    def __init__(self, cfg: SchedulerConfig, allocator: PageAllocator):
        assert cfg.token_budget >= cfg.max_num_seqs, "every running sequence needs a decode slot"  # expect: FC109
        self.cfg = cfg
        self.allocator = allocator
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []

    def add_request(self, req: Request) -> None:
        assert len(req.prompt) + req.max_new_tokens <= self.cfg.max_model_len  # expect: FC109
        self.waiting.append(req)

    def _take_chunk(self, req: Request, budget: int) -> int:
        assert budget >= 0  # ok: FC109
        return min(len(req.prompt) - req.num_computed, self.cfg.chunk_size, budget)

    def schedule(self) -> StepPlan:
        decodes = [ScheduledRow(r, 1) for r in self.running if not r.in_prefill][: self.cfg.token_budget]
        budget = self.cfg.token_budget - len(decodes)
        prefills: List[ScheduledRow] = []
        while self.waiting and len(self.running) < self.cfg.max_num_seqs:
            self.running.append(self.waiting.popleft())
        for req in self.running:
            if req.in_prefill and budget > 0:
                n = self._take_chunk(req, budget)
                prefills.append(ScheduledRow(req, n))
                budget -= n
        rows = decodes + prefills
        self._grow_pages(rows)
        return StepPlan(rows=rows, num_decodes=len(decodes))

    def _grow_pages(self, rows: List[ScheduledRow]) -> None:
        for row in rows:
            need = (row.seq_len_after + PAGE_SIZE - 1) // PAGE_SIZE - len(row.req.pages)
            if need > 0:
                row.req.pages.extend(self.allocator.alloc(need))

    def advance(self, plan: StepPlan, sampled: List[int], eos_id: int) -> List[Request]:
        done: List[Request] = []
        for row, tok in zip(plan.rows, sampled):
            row.req.num_computed += row.num_new_tokens
            if not row.req.in_prefill:
                row.req.output.append(tok)
            if row.req.finished(eos_id):
                done.append(row.req)
        for req in done:
            self.running.remove(req)
        return done
