"""A ring of pinned host slots; an event per slot guards its reuse."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch


def _pinned(n: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype, pin_memory=True)


@dataclass
class PinnedSlot:
    index: int
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    seq_lens: torch.Tensor
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    qo_indptr: torch.Tensor
    # recorded after the host-to-device copies that read this slot have been enqueued
    copied: torch.cuda.Event = field(default_factory=torch.cuda.Event)

    @classmethod
    def allocate(cls, index: int, max_batch: int, max_pages: int) -> "PinnedSlot":
        return cls(
            index,
            kv_indptr=_pinned(max_batch + 1),
            kv_indices=_pinned(max_pages),
            last_page_len=_pinned(max_batch),
            seq_lens=_pinned(max_batch),
            input_ids=_pinned(max_batch, torch.int64),
            positions=_pinned(max_batch, torch.int64),
            slot_mapping=_pinned(max_batch, torch.int64),
            qo_indptr=_pinned(max_batch + 1),
        )

    def ensure_indices(self, nnz: int) -> None:
        if nnz > self.kv_indices.numel():
            self.kv_indices = torch.empty(2 * nnz, dtype=torch.int32, pin_memory=True)  # ok: FC107


class StagingRing:
    def __init__(self, depth: int, max_batch: int, max_pages: int):
        assert depth >= 2, "the ring needs two slots to overlap host and device"  # expect: FC109
        self.depth = depth
        self.slots: List[PinnedSlot] = [PinnedSlot.allocate(i, max_batch, max_pages) for i in range(depth)]
        self._next = 0
        self._held: Optional[int] = None
        self.waits = 0

    def acquire(self) -> PinnedSlot:
        assert self._held is None, "previous slot was not published"  # ok: FC109
        slot = self.slots[self._next]
        self._next = (self._next + 1) % self.depth
        if not slot.copied.query():
            self.waits += 1
            slot.copied.synchronize()  # flashcheck: ignore[FC101] waits for the copies recorded after this slot's previous use: bounds host run-ahead to the ring depth
        self._held = slot.index
        return slot

    def publish(self, slot: PinnedSlot) -> None:
        slot.copied.record()
        self._held = None
