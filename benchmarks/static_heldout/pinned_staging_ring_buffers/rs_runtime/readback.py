"""Sampled tokens come back through their own ring of pinned buffers, read once their event completes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch


@dataclass
class ReadbackSlot:
    tokens: torch.Tensor
    done: torch.cuda.Event = field(default_factory=torch.cuda.Event)
    rows: int = 0
    pending: bool = False


class TokenReadback:
    def __init__(self, depth: int, max_batch: int):
        self.slots = [
            ReadbackSlot(torch.zeros(max_batch, dtype=torch.int64, pin_memory=True)) for _ in range(depth)
        ]
        self._next = 0

    def launch(self, next_ids: torch.Tensor) -> None:
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        rows = next_ids.shape[0]
        slot.tokens[:rows].copy_(next_ids, non_blocking=True)  # ok: FC101
        slot.done.record()
        slot.rows, slot.pending = rows, True

    def collect(self) -> List[List[int]]:
        ready: List[List[int]] = []
        for slot in self.slots:
            if slot.pending and slot.done.query():
                ready.append(slot.tokens[: slot.rows].tolist())  # ok: FC101
                slot.pending = False
        return ready
