"""Reservation table: pages each request holds (reserved up front for high priority, grown on demand otherwise),
a numpy slot-to-page table and its device mirror that the replay metadata is built from."""

from __future__ import annotations

from typing import Dict

import numpy as np
import torch

from prio.limits import PoolLimits, Priority
from prio.pagepool import PagePool


class ReservationTable:
    def __init__(self, limits: PoolLimits, pool: PagePool, device: torch.device, initial_cols: int = 256):
        self.limits = limits
        self.pool = pool
        self.device = device
        self.max_rows = limits.max_rows
        self.pages: Dict[int, np.ndarray] = {}
        self.prio: Dict[int, Priority] = {}
        self.used: Dict[int, int] = {}
        self.page_table_np = np.zeros((limits.max_rows, limits.max_pages_per_req), dtype=np.int32)
        self.page_table_dev = torch.zeros(limits.max_rows, initial_cols, dtype=torch.int32, device=device)
        self.version = 0

    def reserve(self, rid: int, slot: int, num_pages: int, prio: Priority) -> np.ndarray:
        assert num_pages > 0  # expect: FC109
        pages = self.pool.alloc(num_pages)
        self.pages[rid] = pages
        self.prio[rid] = prio
        self.used[rid] = 0
        self.page_table_np[slot, :num_pages] = pages
        self.version += 1
        self._consistency()
        return pages

    def extend(self, rid: int, slot: int, num_pages: int) -> None:
        old = self.pages[rid]
        self.pages[rid] = np.concatenate([old, self.pool.alloc(num_pages)])
        self.page_table_np[slot, : self.pages[rid].size] = self.pages[rid]
        self.version += 1

    def release(self, rid: int) -> None:
        self.pool.free(self.pages.pop(rid))
        self.prio.pop(rid)
        self.used.pop(rid)
        self.version += 1

    def reclaimable_pages(self) -> np.ndarray:
        """Pages low-priority requests hold beyond what they have written."""
        spare = [self.pages[rid][self.used[rid]:] for rid, p in self.prio.items() if p == Priority.LOW]
        return np.concatenate(spare) if spare else np.zeros(0, dtype=np.int32)

    def evict_pages(self, victims: np.ndarray) -> None:
        dead = set(victims.tolist())
        for rid, p in self.prio.items():
            if p == Priority.LOW:
                keep = np.array([pg for pg in self.pages[rid] if pg not in dead], dtype=np.int32)
                self.pages[rid] = keep
        self.version += 1

    def grow_columns(self, cols: int) -> None:
        extra = torch.zeros(self.max_rows, cols - self.page_table_dev.shape[1], dtype=torch.int32, device=self.device)
        self.page_table_dev = torch.cat([self.page_table_dev, extra], dim=1)  # expect: FC107

    def sync_rows(self, slots: np.ndarray) -> None:
        cols = self.page_table_dev.shape[1]
        rows = torch.from_numpy(self.page_table_np[slots, :cols])
        self.page_table_dev[torch.from_numpy(slots).to(self.device)] = rows.to(self.device, non_blocking=True)

    def _consistency(self) -> None:
        assert len(self.pages) <= self.max_rows and self.version >= 0  # ok: FC109
