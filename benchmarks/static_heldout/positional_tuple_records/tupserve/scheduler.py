"""Continuous-batching scheduler.

Requests are kept as lists (``REQ_*`` slots) and handed to the runner as row
tuples (``ROW_*`` slots) plus one sampling-parameter tuple per row (``P_*``).
"""

from __future__ import annotations

from collections import deque
from typing import Iterable

from .config import EngineConfig
from .kv.page_pool import PagePool
from .slots import REQ_OUTPUT, REQ_PAGES, REQ_PARAMS, REQ_PROMPT


class Scheduler:
    def __init__(self, cfg: EngineConfig, pool: PagePool):
        self.cfg = cfg
        self.pool = pool
        self.reqs: dict[int, list] = {}
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.max_new: dict[int, int] = {}

    def add_request(self, rid: int, prompt_ids: list[int], params: tuple, max_new_tokens: int) -> None:
        if not prompt_ids:
            raise ValueError(f"request {rid}: empty prompt")
        if len(prompt_ids) + max_new_tokens > self.cfg.max_seq_len:
            raise ValueError(
                f"request {rid}: {len(prompt_ids)} prompt + {max_new_tokens} new tokens "
                f"exceed max_seq_len={self.cfg.max_seq_len}"
            )
        self.reqs[rid] = [list(prompt_ids), [], [], tuple(params)]
        self.max_new[rid] = max_new_tokens
        self.waiting.append(rid)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _grow(self, rec: list, seq_len: int) -> None:
        need = -(-seq_len // self.cfg.page_size) - len(rec[REQ_PAGES])
        if need > 0:
            rec[REQ_PAGES].extend(self.pool.alloc(need))

    def schedule(self) -> tuple[list[tuple], list[tuple]]:
        rows: list[tuple] = []
        params: list[tuple] = []
        budget = self.cfg.max_num_tokens
        for rid in self.running:
            rec = self.reqs[rid]
            seq_len = len(rec[REQ_PROMPT]) + len(rec[REQ_OUTPUT])
            self._grow(rec, seq_len)
            rows.append((rid, seq_len, 1, rec[REQ_PAGES], rec[REQ_OUTPUT][-1:]))
            params.append(rec[REQ_PARAMS] + (len(rec[REQ_OUTPUT]),))
            budget -= 1
        while self.waiting and len(rows) < self.cfg.max_batch_size:
            rec = self.reqs[self.waiting[0]]
            n = len(rec[REQ_PROMPT])
            if n > budget or -(-n // self.cfg.page_size) > self.pool.available():
                break
            rid = self.waiting.popleft()
            self._grow(rec, n)
            rows.append((rid, n, n, rec[REQ_PAGES], rec[REQ_PROMPT]))
            params.append(rec[REQ_PARAMS] + (0,))
            self.running.append(rid)
            budget -= n
        return rows, params

    def append_tokens(self, rids: Iterable[int], tokens: Iterable[int]) -> None:
        done = []
        for rid, tok in zip(rids, tokens):
            out = self.reqs[rid][REQ_OUTPUT]
            out.append(tok)
            if len(out) >= self.max_new[rid]:
                done.append(rid)
        self.finish(done)

    def finish(self, rids: Iterable[int]) -> None:
        for rid in rids:
            rec = self.reqs.pop(rid, None)
            if rec is None:
                continue
            self.pool.release(rec[REQ_PAGES])
            self.running.remove(rid)
            self.max_new.pop(rid, None)

    def remap_pages(self, moved: dict[int, int]) -> None:
        for rec in self.reqs.values():
            rec[REQ_PAGES][:] = [moved.get(p, p) for p in rec[REQ_PAGES]]
