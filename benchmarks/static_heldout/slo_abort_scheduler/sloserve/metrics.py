"""SLO accounting, drained by the metrics exporter thread (never on the step path)."""

from __future__ import annotations

import collections
import threading
from typing import Deque, Dict, List, Tuple

import torch


class SloMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Deque[Tuple[torch.cuda.Event, List[int], List[float]]] = collections.deque()
        self.ttft_misses = 0
        self.tpot_misses = 0
        self.tokens = 0

    def push(self, done: torch.cuda.Event, rids: List[int], deadlines_ms: List[float]) -> None:
        with self._lock:
            self._pending.append((done, rids, deadlines_ms))

    def drain(self, now_ms: float) -> Dict[str, int]:
        while True:
            with self._lock:
                if not self._pending:
                    break
                done, rids, deadlines = self._pending.popleft()
            done.synchronize()  # ok: FC101
            self.tokens += len(rids)
            self.tpot_misses += sum(1 for d in deadlines if d < now_ms)
        return {"tokens": self.tokens, "ttft_misses": self.ttft_misses, "tpot_misses": self.tpot_misses}
