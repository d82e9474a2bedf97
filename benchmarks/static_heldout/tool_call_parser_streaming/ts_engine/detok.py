"""Detokenization off the step: the step copies ids into pinned memory and records an event;
a pool thread waits on the event, decodes and hands text to the server."""
from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from typing import List, Tuple

import torch
from flashcheck import hot_path


class DetokPool:
    def __init__(self, tokenizer, max_rows: int, workers: int = 4) -> None:
        self.tokenizer = tokenizer
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="detok")
        self.ids_pinned = torch.zeros(max_rows, dtype=torch.int64, pin_memory=True)
        self.done_pinned = torch.zeros(max_rows, dtype=torch.bool, pin_memory=True)
        self.outbox: "queue.Queue[Tuple[str, str, bool]]" = queue.Queue()

    @hot_path
    def submit(self, request_ids: List[str], next_ids: torch.Tensor, done: torch.Tensor) -> int:
        n = len(request_ids)
        self.ids_pinned[:n].copy_(next_ids, non_blocking=True)
        self.done_pinned[:n].copy_(done, non_blocking=True)
        n_done = int(self.done_pinned[:n].sum())  # expect: FC101
        event = torch.cuda.Event()
        event.record()
        self.pool.submit(self._detok_job, event, list(request_ids), n)
        return n_done

    def _detok_job(self, event: torch.cuda.Event, request_ids: List[str], n: int) -> None:
        event.synchronize()  # ok: FC101
        ids = self.ids_pinned[:n].tolist()
        done = self.done_pinned[:n].tolist()
        for rid, tok, fin in zip(request_ids, ids, done):
            self.outbox.put((rid, self.tokenizer.decode([tok], skip_special_tokens=False), fin))
