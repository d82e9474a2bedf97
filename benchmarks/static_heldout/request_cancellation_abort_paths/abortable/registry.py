"""Abort flags written by the API thread and read by the engine at step boundaries."""
from __future__ import annotations

import threading
import time
from typing import Dict, List, Optional

import numpy as np


class AbortRegistry:
    def __init__(self, max_slots: int):
        self.max_slots = max_slots
        self._lock = threading.Lock()
        self._slot_of: Dict[str, int] = {}
        self._free_slots: List[int] = list(range(max_slots - 1, -1, -1))
        self.flags_np = np.zeros(max_slots, dtype=np.bool_)
        self.abort_time = np.zeros(max_slots, dtype=np.float64)

    def admit(self, request_id: str) -> int:
        with self._lock:
            slot = self._free_slots.pop()
            self._slot_of[request_id] = slot
            self.flags_np[slot] = False
            self._check()
            return slot

    def abort(self, request_id: str) -> bool:
        """Called from the API thread when a client disconnects or cancels."""
        assert isinstance(request_id, str), "request ids are strings"  # expect: FC109
        with self._lock:
            slot = self._slot_of.get(request_id)
            if slot is None:
                return False
            self.flags_np[slot] = True
            self.abort_time[slot] = time.monotonic()
            return True

    def slot(self, request_id: str) -> Optional[int]:
        with self._lock:
            return self._slot_of.get(request_id)

    def release(self, request_ids: List[str]) -> List[float]:
        """Free the slots of reaped requests; returns abort latencies of the aborted ones."""
        now = time.monotonic()
        latencies = []
        with self._lock:
            for rid in request_ids:
                slot = self._slot_of.pop(rid, None)
                if slot is None:
                    continue
                if self.flags_np[slot]:
                    latencies.append(now - float(self.abort_time[slot]))
                self.flags_np[slot] = False
                self._free_slots.append(slot)
            self._check()
        return latencies

    def _check(self) -> None:
        assert len(self._free_slots) + len(self._slot_of) == self.max_slots  # ok: FC109
