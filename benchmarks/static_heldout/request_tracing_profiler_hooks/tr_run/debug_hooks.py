"""Debug trace hooks registered by configuration."""
from __future__ import annotations

from tr_attn.backend import TracedAttnBackend


class PoisonHook:
    """Fills the unused page-index slots with -1 so a stale read faults loudly instead of reading another KV."""

    def __init__(self, backend: TracedAttnBackend):
        self.backend = backend

    def after_step(self, step_idx: int) -> None:
        used = self.backend.num_pages_used
        self.backend.kv_indices_buf[used:].fill_(-1)  # expect: FC104


class StepCounterHook:
    def __init__(self) -> None:
        self.count = 0

    def after_step(self, step_idx: int) -> None:
        self.count = step_idx + 1
