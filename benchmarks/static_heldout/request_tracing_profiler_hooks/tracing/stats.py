"""Collects per-step tensor statistics (absmax, mean, NaN count) on the device; flushes every N steps."""
from __future__ import annotations

from typing import Dict, List

import torch
from flashcheck import hot_path


class TensorStatsCollector:
    def __init__(self, max_slots: int, flush_every: int, device: torch.device):
        self.flush_every = flush_every
        self.acc = torch.zeros(max_slots, 3, dtype=torch.float32, device=device)
        self.acc_host = torch.zeros(max_slots, 3, dtype=torch.float32, pin_memory=True)
        self.flush_event = torch.cuda.Event()
        self.slots: Dict[str, int] = {}
        self.pending: Dict[str, torch.Tensor] = {}
        self.nan_steps: List[int] = []

    def observe(self, name: str, t: torch.Tensor) -> None:
        self.slots.setdefault(name, len(self.slots))
        self.pending[name] = t

    @hot_path
    def on_step(self, step_idx: int) -> None:
        for name, t in self.pending.items():
            slot = self.slots[name]
            stats = torch.stack([t.abs().amax().float(), t.float().mean(), t.isnan().sum().float()])
            self.acc[slot].copy_(stats)  # ok: FC104
            if self.acc[slot, 2] > 0:  # expect: FC101
                self.nan_steps.append(step_idx)
        self.pending.clear()
        if step_idx % self.flush_every == 0:
            self.acc_host.copy_(self.acc, non_blocking=True)  # ok: FC101
            self.flush_event.record()
            self.acc = self.acc.new_zeros(self.acc.shape)  # expect: FC107

    def flush(self) -> Dict[str, List[float]]:
        self.flush_event.synchronize()
        rows = self.acc_host.tolist()
        return {name: rows[slot] for name, slot in self.slots.items()}
