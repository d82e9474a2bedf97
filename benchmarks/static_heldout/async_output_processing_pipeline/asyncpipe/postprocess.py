"""Stage 2: step N's outputs become text, stop decisions and logprobs while step N+1 runs."""

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

from asyncpipe.detok import DetokState, IncrementalDetokenizer, StopChecker, StopCriteria
from asyncpipe.pinned import OutputSlot, PinnedOutputRing
from asyncpipe.queue import BoundedStepQueue

logger = logging.getLogger(__name__)


@dataclass
class RequestState:
    request_id: str
    row: int
    criteria: StopCriteria
    detok: DetokState = field(default_factory=DetokState)
    num_generated: int = 0
    logprobs: List[float] = field(default_factory=list)
    top_logprobs: List[Dict[int, float]] = field(default_factory=list)
    finish_reason: Optional[str] = None


@dataclass
class StepRecord:
    step: int
    slot: OutputSlot
    rows: List[RequestState]


class OutputProcessor:
    def __init__(
        self,
        queue: BoundedStepQueue,
        ring: PinnedOutputRing,
        detok: IncrementalDetokenizer,
        on_finished: Callable[[List[RequestState]], None],
        emit: Callable[[str, str, bool], None],
    ):
        self.queue = queue
        self.ring = ring
        self.detok = detok
        self.stops = StopChecker()
        self.on_finished = on_finished
        self.emit = emit
        self._thread = threading.Thread(target=self._loop, name="output-processor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self.queue.close()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            rec = self.queue.get()
            if rec is None:
                return
            try:
                self._process(rec)
            except Exception:
                logger.exception("post-processing of step %d failed", rec.step)
            finally:
                self.ring.release(rec.slot)

    def _process(self, rec: StepRecord) -> None:
        slot = rec.slot
        n = slot.num_rows
        slot.ready.synchronize()  # ok: FC101
        tokens = slot.tokens_pinned[:n].tolist()  # ok: FC101
        chosen_lp = slot.logprobs_pinned[:n].tolist()
        top_ids = slot.top_ids_pinned[:n].tolist()
        top_lp = slot.top_lp_pinned[:n].tolist()
        finished = []
        for req in rec.rows:
            if req.finish_reason is not None:
                continue  # stopped in an earlier step, its row is still padding in this one
            tok = tokens[req.row]
            req.num_generated += 1
            req.logprobs.append(chosen_lp[req.row])
            req.top_logprobs.append(dict(zip(top_ids[req.row], top_lp[req.row])))
            delta = self.detok.step(req.detok, [tok])
            req.finish_reason = self.stops.check(req.criteria, req.detok, req.num_generated, tok)
            self.emit(req.request_id, delta, req.finish_reason is not None)
            if req.finish_reason is not None:
                finished.append(req)
        if finished:
            self.on_finished(finished)
