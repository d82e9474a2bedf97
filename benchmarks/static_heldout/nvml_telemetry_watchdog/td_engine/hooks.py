"""Per-step hooks: the engine calls ``before_step`` / ``after_step``; telemetry and the watchdog
hang off them, plus any callbacks registered at start-up."""

from collections import deque
from typing import Callable, List

import torch

from td_engine.batch import StepBatch
from telemetry import StepTimer, Watchdog


class EngineHooks:
    def __init__(self, timer: StepTimer, watchdog: Watchdog, log_every: int):
        self.timer = timer
        self.watchdog = watchdog
        self.log_every = log_every
        self.lines = deque(maxlen=1024)
        self.peak_allocated = 0
        self.extra: List[Callable[[int], None]] = []

    def register(self, fn: Callable[[int], None]) -> None:
        self.extra.append(fn)

    def before_step(self, step_id: int, batch: StepBatch) -> None:
        self.timer.on_step_begin()

    def after_step(self, step_id: int, batch: StepBatch) -> None:
        self.timer.on_step_end(step_id)
        self.watchdog.beat(step_id, batch.positions.max())
        self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated())  # ok: FC101
        if step_id % self.log_every == 0:
            self.lines.append(f"step={step_id} rows={batch.batch_size} max_seq={batch.seq_lens.max()}")  # expect: FC101
        for fn in self.extra:
            fn(step_id)
