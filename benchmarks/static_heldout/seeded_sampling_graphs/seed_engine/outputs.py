"""Sampled ids leave the device through a ring of pinned buffers, read by a thread."""

from __future__ import annotations

import queue
import threading
from typing import List, Optional

import torch

from seedserve.params import Request


class OutputDrain:
    RING = 4

    def __init__(self, max_bs: int):
        self._ring = [torch.zeros(max_bs, dtype=torch.int64, pin_memory=True) for _ in range(self.RING)]
        self._events = [torch.cuda.Event() for _ in range(self.RING)]
        self._next = 0
        self._q: "queue.Queue" = queue.Queue(maxsize=self.RING - 1)
        self._thread = threading.Thread(target=self._drain_loop, name="output-drain", daemon=True)
        self._thread.start()

    def push(self, ids: torch.Tensor, reqs: List[Request], logprobs: Optional[List[List[float]]]) -> None:
        i = self._next
        self._next = (i + 1) % self.RING
        n = len(reqs)
        self._ring[i][:n].copy_(ids, non_blocking=True)
        self._events[i].record()
        self._q.put((i, reqs, logprobs))

    def _drain_loop(self) -> None:
        while True:
            i, reqs, logprobs = self._q.get()
            self._events[i].synchronize()
            toks = self._ring[i][: len(reqs)].tolist()  # ok: FC101
            for j, (req, tok) in enumerate(zip(reqs, toks)):
                req.output_ids.append(tok)
                if logprobs is not None:
                    req.output_logprobs.append(logprobs[j])
                eos = req.params.eos_token_id
                if (eos is not None and tok == eos) or req.done_by_length:
                    req.finished = True
