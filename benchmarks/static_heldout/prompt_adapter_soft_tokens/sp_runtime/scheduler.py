"""Host-side scheduling of soft-prompt requests (numpy only)."""

from collections import deque
from dataclasses import dataclass, field
from typing import Deque, List, Optional

import numpy as np

from softprompt.attn.metadata import SoftBatch
from softprompt.config import SoftPromptConfig


@dataclass
class SoftRequest:
    req_id: int
    prompt_ids: List[int]
    adapter_id: int
    virtual_len: int
    max_new_tokens: int
    pages: List[int] = field(default_factory=list)
    generated: int = 0
    prefilled: bool = False

    @property
    def seq_len(self) -> int:
        return self.virtual_len + len(self.prompt_ids) + self.generated


class SoftScheduler:
    def __init__(self, cfg: SoftPromptConfig) -> None:
        self.cfg = cfg
        self.waiting: Deque[SoftRequest] = deque()
        self.running: List[SoftRequest] = []
        self._free_pages: List[int] = list(range(cfg.num_pages - 1, -1, -1))
        self._last_rows: List[SoftRequest] = []

    def add(self, req: SoftRequest) -> None:
        self.waiting.append(req)

    def _grow_pages(self, req: SoftRequest, extra: int) -> None:
        need = -(-(req.seq_len + extra) // self.cfg.page_size) - len(req.pages)
        for _ in range(max(need, 0)):
            req.pages.append(self._free_pages.pop())

    def next_batch(self) -> Optional[SoftBatch]:
        cfg = self.cfg
        if self.waiting and len(self.running) < cfg.max_batch_size:
            req = self.waiting.popleft()
            self._grow_pages(req, 0)
            self._last_rows = [req]
            return self._pack([req], is_decode=False)
        if not self.running:
            return None
        rows = self.running[: cfg.max_batch_size]
        for r in rows:
            self._grow_pages(r, 1)
        self._last_rows = rows
        return self._pack(rows, is_decode=True)

    def _pack(self, rows: List[SoftRequest], is_decode: bool) -> SoftBatch:
        page = self.cfg.page_size
        bs = len(rows)
        if is_decode:
            q_lens = np.ones(bs, dtype=np.int64)
            ids = np.zeros(bs, dtype=np.int64)
            soft = np.zeros(bs, dtype=bool)
        else:
            q_lens = np.array([r.virtual_len + len(r.prompt_ids) for r in rows], dtype=np.int64)
            ids = np.concatenate([np.array([0] * r.virtual_len + r.prompt_ids, dtype=np.int64) for r in rows])
            soft = np.concatenate([np.arange(q) < r.virtual_len for q, r in zip(q_lens, rows)])
        qo_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qo_indptr[1:])
        kv_lens = np.array([r.seq_len + (1 if is_decode else 0) for r in rows], dtype=np.int32)
        n_pages = (kv_lens + page - 1) // page
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(n_pages, out=kv_indptr[1:])
        kv_indices = np.concatenate([np.array(r.pages[:n], dtype=np.int32) for r, n in zip(rows, n_pages)])
        finished = np.array(
            [i for i, r in enumerate(rows) if is_decode and r.generated + 1 >= r.max_new_tokens], dtype=np.int64
        )
        return SoftBatch(
            bs=bs,
            is_decode=is_decode,
            input_ids_np=ids,
            adapter_ids_np=np.array([r.adapter_id for r in rows], dtype=np.int64),
            virtual_lens_np=np.array([r.virtual_len for r in rows], dtype=np.int64),
            q_lens_np=q_lens,
            qo_indptr_np=qo_indptr,
            kv_indptr_np=kv_indptr,
            kv_indices_np=kv_indices,
            last_page_len_np=(kv_lens - (n_pages - 1) * page).astype(np.int32),
            soft_mask_np=soft,
            finished_rows_np=finished,
        )

    def commit(self, batch: SoftBatch) -> None:
        rows = self._last_rows
        for r in rows:
            if batch.is_decode:
                r.generated += 1
            else:
                r.prefilled = True
                self.running.append(r)
        done = {id(rows[i]) for i in batch.finished_rows_np.tolist()}
        for r in self.running:
            if id(r) in done:
                self._free_pages.extend(r.pages)
        self.running = [r for r in self.running if id(r) not in done]
