from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field
from typing import List, Optional, Set


class Priority(enum.IntEnum):
    INTERACTIVE = 0
    STANDARD = 1
    BATCH = 2


class ReqState(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    priority: Priority = Priority.STANDARD
    arrival_ms: float = 0.0
    ttft_deadline_ms: float = 2000.0
    tpot_slo_ms: float = 50.0
    max_new_tokens: int = 512
    state: ReqState = ReqState.WAITING
    slot: Optional[int] = None
    num_computed: int = 0
    output_ids: List[int] = field(default_factory=list)

    @property
    def deadline_ms(self) -> float:
        if self.state in (ReqState.WAITING, ReqState.PREEMPTED):
            return self.arrival_ms + self.ttft_deadline_ms
        return self.arrival_ms + self.ttft_deadline_ms + self.tpot_slo_ms * len(self.output_ids)


class AbortRegistry:
    """Filled from the API server's threads when a client disconnects; drained once per step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rids: Set[int] = set()

    def abort(self, rid: int) -> None:
        with self._lock:
            self._rids.add(rid)

    def drain(self) -> List[int]:
        with self._lock:
            out, self._rids = sorted(self._rids), set()
        return out
