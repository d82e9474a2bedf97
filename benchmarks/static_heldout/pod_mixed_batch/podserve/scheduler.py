"""Token-budget scheduler: every running decode plus at most one prefill chunk per step.

POD attention runs one prefill request beside a batch of decodes, so the budget is split as
``max_num_tokens = chunk_len + num_decodes``; decodes are never starved, the chunk takes what is left.
Everything here is host data (lists and numpy arrays); the attention backend turns it into tensors.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import numpy as np

from podserve.config import PodConfig


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    pages: List[int] = field(default_factory=list)
    num_computed: int = 0
    output_ids: List[int] = field(default_factory=list)

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < len(self.prompt_ids)

    @property
    def next_token(self) -> int:
        return (self.output_ids or self.prompt_ids)[-1]


@dataclass
class StepPlan:
    prefill: Optional[Request]
    chunk_start: int
    chunk_len: int
    decodes: List[Request]
    decode_kv_indptr_np: np.ndarray
    decode_kv_indices_np: np.ndarray
    decode_last_page_len_np: np.ndarray
    decode_seq_lens_np: np.ndarray
    longest_decode: int = 0

    @property
    def num_decodes(self) -> int:
        return len(self.decodes)

    @property
    def num_tokens(self) -> int:
        return self.chunk_len + len(self.decodes)


class PageAllocator:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self.free: Deque[int] = collections.deque(range(num_pages))

    def alloc(self, n: int) -> List[int]:
        if n > len(self.free):
            raise RuntimeError(f"out of KV pages: need {n}, {len(self.free)} free")
        return [self.free.popleft() for _ in range(n)]


class BudgetScheduler:
    def __init__(self, cfg: PodConfig):
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.allocator = PageAllocator(cfg.max_num_pages)
        self.waiting: Deque[Request] = collections.deque()
        self.running: List[Request] = []
        self._budget = 0

    def add_request(self, req: Request) -> None:
        assert len(req.prompt_ids) > 0, "empty prompt"  # expect: FC109
        self.waiting.append(req)

    def _pages_needed(self, req: Request, new_tokens: int) -> int:
        total = req.num_computed + new_tokens
        have = len(req.pages) * self.page_size
        return max(0, -(-(total - have) // self.page_size))

    def _take_chunk(self) -> Optional[Request]:
        req = next((r for r in self.running if r.is_prefilling), None)
        if req is None:
            if not self.waiting:
                return None
            req = self.waiting.popleft()
            self.running.append(req)
        chunk = min(len(req.prompt_ids) - req.num_computed, self.cfg.max_prefill_chunk, self._budget)
        if chunk <= 0:
            return None
        req.pages.extend(self.allocator.alloc(self._pages_needed(req, chunk)))
        self._budget -= chunk
        assert self._budget >= 0, "token budget went negative"  # ok: FC109
        self._chunk_len = chunk
        return req

    def schedule(self) -> StepPlan:
        decodes = [r for r in self.running if not r.is_prefilling][: self.cfg.max_batch_size]
        for req in decodes:
            req.pages.extend(self.allocator.alloc(self._pages_needed(req, 1)))
        self._budget = self.cfg.max_num_tokens - len(decodes)
        self._chunk_len = 0
        prefill = self._take_chunk()
        chunk_start = prefill.num_computed if prefill is not None else 0

        decode_lens = [r.num_computed + 1 for r in decodes]
        longest = max(decode_lens, default=0)  # ok: FC101
        pages_per_req = np.fromiter((len(r.pages) for r in decodes), dtype=np.int32, count=len(decodes))
        indptr = np.zeros(len(decodes) + 1, dtype=np.int32)
        np.cumsum(pages_per_req, out=indptr[1:])
        n_pages = int(indptr[-1])  # ok: FC101
        indices = np.fromiter(itertools.chain.from_iterable(r.pages for r in decodes), dtype=np.int32, count=n_pages)
        seq_lens = np.asarray(decode_lens, dtype=np.int32)
        last_page_len = ((seq_lens - 1) % self.page_size + 1).astype(np.int32)
        return StepPlan(prefill, chunk_start, self._chunk_len, decodes, indptr, indices, last_page_len, seq_lens, longest)

    def commit(self, plan: StepPlan, token_ids: List[int]) -> List[Request]:
        """Runs in the output thread once the step's sampled ids are on the host."""
        done: List[Request] = []
        for req, tok in zip(plan.decodes, token_ids):
            req.num_computed += 1
            req.output_ids.append(tok)
            if tok == self.cfg.eos_token_id or len(req.output_ids) >= req.max_new_tokens:
                done.append(req)
        if plan.prefill is not None:
            plan.prefill.num_computed += plan.chunk_len
        for req in done:
            self.finish(req)
        return done

    def finish(self, req: Request) -> None:
        if req in self.running:
            self.running.remove(req)
        self.allocator.free.extend(req.pages)
        req.pages = []
