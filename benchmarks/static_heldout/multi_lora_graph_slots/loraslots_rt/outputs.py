"""Streams sampled tokens to the host: a non_blocking copy per step, read by a drain thread."""

from __future__ import annotations

import collections
import queue
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import torch


class OutputQueue:
    def __init__(self) -> None:
        self._pending: "queue.Queue[Tuple[List[int], torch.Tensor, torch.cuda.Event]]" = queue.Queue()
        self.results: Dict[int, List[int]] = collections.defaultdict(list)
        self._thread: Optional[threading.Thread] = None

    def push(self, req_ids: Sequence[int], next_ids: torch.Tensor) -> None:
        host = torch.empty(len(req_ids), dtype=torch.int64, pin_memory=True)
        host.copy_(next_ids, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        self._pending.put((list(req_ids), host, ready))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._drain_loop, name="lora-output", daemon=True)
        self._thread.start()

    def _drain_loop(self) -> None:
        while True:
            req_ids, host, ready = self._pending.get()
            ready.synchronize()  # ok: FC101
            for rid, tok in zip(req_ids, host.tolist()):
                self.results[rid].append(tok)
