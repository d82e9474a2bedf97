"""Decode rows first, then chunks of waiting prompts until the step's token budget is spent."""

import collections
from dataclasses import dataclass
from typing import Deque, List, Optional

import numpy as np

from chunkserve.budget import TokenBudget
from chunkserve.config import ChunkConfig
from chunkserve.request import PrefillChunk, Request, StepPlan


@dataclass
class StepPlanInfo:
    num_decodes: int
    num_chunks: int
    tokens: int


class PagePool:
    def __init__(self, num_pages: int):
        self._free: List[int] = list(range(num_pages - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> np.ndarray:
        return np.array([self._free.pop() for _ in range(n)], dtype=np.int32)

    def free(self, pages_np: np.ndarray) -> None:
        self._free.extend(pages_np.tolist())


class ChunkedScheduler:
    def __init__(self, cfg: ChunkConfig, pool: PagePool):
        self.cfg = cfg
        self.pool = pool
        self.waiting: Deque[Request] = collections.deque()
        self.prefilling: List[Request] = []
        self.running: List[Request] = []
        self._plan_info: Optional[StepPlanInfo] = None

    def add_request(self, req: Request) -> None:
        assert 0 < req.prompt_len <= self.cfg.max_model_len, "prompt empty or longer than the model"  # expect: FC109
        self.waiting.append(req)

    def _ensure_pages(self, req: Request, upto: int) -> bool:
        need = (upto + self.cfg.page_size - 1) // self.cfg.page_size - len(req.pages)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        req.pages = np.concatenate([req.pages, self.pool.alloc(need)])
        return True

    def _split_chunk(self, req: Request, budget: TokenBudget) -> Optional[PrefillChunk]:
        n = budget.take(req.prompt_len - req.num_computed)
        assert n >= 0, "budget handed out a negative chunk"  # ok: FC109
        if n == 0 or not self._ensure_pages(req, req.num_computed + n):
            return None
        return PrefillChunk(req, req.num_computed, req.num_computed + n)

    def schedule(self) -> StepPlan:
        budget = TokenBudget(self.cfg.token_budget, self.cfg.chunk_size)
        decodes = [r for r in self.running if self._ensure_pages(r, r.seq_len + 1)]
        decodes = decodes[: budget.take_rows(min(len(decodes), self.cfg.max_running))]
        chunks: List[PrefillChunk] = []
        for req in list(self.prefilling):
            chunk = self._split_chunk(req, budget)
            if chunk is not None:
                chunks.append(chunk)
        while self.waiting and budget.remaining > 0 and len(self.running) + len(self.prefilling) < self.cfg.max_running:
            req = self.waiting.popleft()
            self.prefilling.append(req)
            chunk = self._split_chunk(req, budget)
            if chunk is None:
                break
            chunks.append(chunk)
        self._plan_info = StepPlanInfo(len(decodes), len(chunks), budget.used)  # ok: FC103
        return StepPlan(decodes, chunks)

    def commit(self, plan: StepPlan, sampled: List[int]) -> List[Request]:
        """Apply one step's outcome; `sampled` holds one token per decode row, then per completed prompt."""
        finished = []
        it = iter(sampled)
        for req in plan.decodes:
            req.output_ids.append(next(it))
            if len(req.output_ids) >= req.max_new_tokens:
                finished.append(req)
        for chunk in plan.chunks:
            chunk.req.num_computed = chunk.end
            if chunk.completes_prompt:
                chunk.req.output_ids.append(next(it))
                self.prefilling.remove(chunk.req)
                self.running.append(chunk.req)
        for req in finished:
            self.running.remove(req)
            self.pool.free(req.pages)
        return finished
