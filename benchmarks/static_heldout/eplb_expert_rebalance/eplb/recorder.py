"""Per-step expert load counters on the device.

The captured MoE layers ``index_add_`` the tokens each physical slot received into ``step_counts[layer]``; after
every step (replay or eager) ``on_step`` folds them into the window and clears them; every ``window_steps`` the
window is snapshotted for the rebalancer and reset.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)


class ExpertLoadRecorder:
    def __init__(self, num_layers: int, num_physical: int, window_steps: int, device: torch.device) -> None:
        self.num_layers = num_layers
        self.num_physical = num_physical
        self.window_steps = window_steps
        self.step_counts = torch.zeros(num_layers, num_physical, dtype=torch.int32, device=device)
        self.window_counts = torch.zeros(num_layers, num_physical, dtype=torch.int64, device=device)
        self.load_host = torch.zeros(num_layers, num_physical, dtype=torch.int64, pin_memory=True)
        self.snapshot: Optional[torch.Tensor] = None
        self.snapshot_ready = False
        self.steps_in_window = 0
        self.tokens_last_window = 0

    def on_step(self, num_tokens: int) -> None:
        self.window_counts.add_(self.step_counts)
        # fresh counters for the next step
        self.step_counts = torch.zeros_like(self.step_counts)  # expect: FC107
        self.steps_in_window += 1
        if self.steps_in_window < self.window_steps:
            return
        if self.snapshot is None:
            self.snapshot = torch.empty_like(self.window_counts)  # ok: FC107
        self.snapshot.copy_(self.window_counts)
        # dashboard gauge: tokens routed in the window that just closed
        self.load_host.copy_(self.window_counts, non_blocking=True)
        self.tokens_last_window = int(self.load_host.sum())  # expect: FC101
        self.window_counts.zero_()  # ok: FC107
        self.steps_in_window = 0
        self.snapshot_ready = True

    def take_snapshot(self) -> Optional[torch.Tensor]:
        if not self.snapshot_ready:
            return None
        self.snapshot_ready = False
        return self.snapshot
