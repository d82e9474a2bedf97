import logging
import time
from typing import Optional

import torch
from flashcheck import hot_path

logger = logging.getLogger(__name__)


class HealthChecker:
    """Readiness and liveness for the platform's probes; ready once the first buckets are warm."""

    def __init__(self, max_step_ms: float, warm_buckets_needed: int):
        self.max_step_ms = max_step_ms
        assert self.max_step_ms > 0  # expect: FC109
        self.warm_buckets_needed = warm_buckets_needed
        self.warm_buckets = 0
        self.last_step_ms: Optional[float] = None
        self.nan_steps = 0
        self.done_event = torch.cuda.Event()

    @hot_path
    def record_step(self, started: float, logits: torch.Tensor) -> None:
        self.last_step_ms = (time.perf_counter() - started) * 1e3
        self.done_event.record()
        if torch.isnan(logits).any():  # expect: FC101
            self.nan_steps += 1

    def gpu_idle(self) -> bool:
        return self.done_event.query()  # ok: FC101

    def ready(self) -> bool:
        return self.warm_buckets >= self.warm_buckets_needed

    def live(self) -> bool:
        return self.last_step_ms is None or self.last_step_ms < 10 * self.max_step_ms
