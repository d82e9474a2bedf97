"""Scheduler: requests come in through an asyncio queue, results go back through per-request futures."""

import asyncio
import collections
from typing import Optional

import numpy as np

from asyncserve.config import AsyncEngineConfig
from asyncserve.protocol import Request, ScheduledBatch


class HostPagePool:
    def __init__(self, num_pages: int):
        self.free = collections.deque(range(num_pages))

    def alloc(self, n: int) -> list:
        if n > len(self.free):
            raise MemoryError(f"need {n} pages, {len(self.free)} free")
        return [self.free.popleft() for _ in range(n)]

    def release(self, pages: list):
        self.free.extend(pages)


class AsyncScheduler:
    def __init__(self, cfg: AsyncEngineConfig):
        self.cfg = cfg
        self.pages = HostPagePool(cfg.max_total_pages)
        self.waiting = collections.deque()
        self.running = {}
        self.step_id = 0
        self.wakeup = asyncio.Event()
        self._closed = False

    def add(self, req: Request):
        assert not self._closed, "scheduler is shut down"  # ok: FC109
        self.waiting.append(req)
        self.wakeup.set()

    def close(self):
        self._closed = True

    def _grow_pages(self, req: Request, new_len: int):
        need = (new_len + self.cfg.page_size - 1) // self.cfg.page_size - len(req.page_ids)
        if need > 0:
            req.page_ids.extend(self.pages.alloc(need))

    def schedule(self) -> Optional[ScheduledBatch]:
        self.step_id += 1
        if self.waiting:
            budget = self.cfg.max_num_tokens
            reqs = []
            while self.waiting and len(reqs) < self.cfg.max_batch_size and len(self.waiting[0].prompt) <= budget:
                req = self.waiting.popleft()
                budget -= len(req.prompt)
                self._grow_pages(req, req.seq_len)
                self.running[req.rid] = req
                reqs.append(req)
            if reqs:
                return ScheduledBatch(self.step_id, reqs, is_decode=False)
        if not self.running:
            return None
        reqs = list(self.running.values())[: self.cfg.max_batch_size]
        for req in reqs:
            # one more token lands this step (its value is still on the device)
            self._grow_pages(req, req.seq_len + 1)
        return ScheduledBatch(self.step_id, reqs, is_decode=True)

    def commit(self, req_ids: list, tokens: list):
        for rid, tok in zip(req_ids, tokens):
            req = self.running.get(rid)
            if req is None:
                continue
            req.out_tokens.append(tok)
            req.computed = req.seq_len - 1
            if tok == self.cfg.eos_token_id or len(req.out_tokens) >= req.max_new_tokens:
                del self.running[rid]
                self.pages.release(req.page_ids)
                if not req.done.done():
                    req.done.set_result(np.asarray(req.out_tokens, dtype=np.int64).tolist())
