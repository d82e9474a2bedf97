"""Prefill -> decode handoff of finished prompts."""

from __future__ import annotations

import threading
from collections import deque
from typing import Deque, List

import torch


class HandoffRecord:
    """Built by the prefill worker, on its stream, for every request whose prompt is complete."""

    def __init__(self, rid: str, pages: List[int], prompt_len: int, page_size: int, first_ids: torch.Tensor,
                 device: torch.device):
        self.rid = rid
        self.pages = pages
        self.prompt_len = prompt_len
        self.last_page_len = prompt_len - (len(pages) - 1) * page_size
        self.page_ids = torch.tensor(pages, dtype=torch.int32, device=device)  # ok: FC107
        self.first_ids = first_ids
        self.kv_written = torch.cuda.Event()


class HandoffQueue:
    def __init__(self):
        self._q: Deque[HandoffRecord] = deque()
        self._lock = threading.Lock()

    def put(self, rec: HandoffRecord) -> None:
        with self._lock:
            self._q.append(rec)

    def drain(self) -> List[HandoffRecord]:
        with self._lock:
            out = list(self._q)
            self._q.clear()
        return out
