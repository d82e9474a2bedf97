"""The scheduler-facing loop: one ``ModelRunner.step`` per scheduled batch."""

from __future__ import annotations

import logging
from typing import List, Optional, Protocol

from .config import EngineConfig
from .forward_batch import ScheduledBatch
from .runner.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class Scheduler(Protocol):
    def next_batch(self) -> Optional[ScheduledBatch]: ...

    def commit(self, token_ids: List[int]) -> None: ...

    def idle_wait(self) -> None: ...


class Engine:
    def __init__(self, cfg: EngineConfig, scheduler: Scheduler) -> None:
        self.runner = ModelRunner(cfg)
        self.scheduler = scheduler
        self.steps = 0

    def serve_forever(self) -> None:
        while True:
            sched = self.scheduler.next_batch()
            if sched is None:
                self.scheduler.idle_wait()
                continue
            out = self.runner.step(sched)
            self.scheduler.commit(out.tokens())
            self.steps += 1
            if self.steps % 1000 == 0:
                logger.info("served %d steps", self.steps)
