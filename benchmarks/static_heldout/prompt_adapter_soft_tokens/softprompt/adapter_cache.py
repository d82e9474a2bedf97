"""LRU of soft prompts resident in the device slot table."""

from collections import OrderedDict
from typing import Dict, List, Optional

import numpy as np
import torch

from .slot_table import EmbeddingSlotTable


class AdapterCache:
    def __init__(self, table: EmbeddingSlotTable, max_adapter_ids: int, grow_by: int) -> None:
        self.table = table
        self.grow_by = grow_by
        self.host_store: Dict[int, torch.Tensor] = {}
        self._lru: "OrderedDict[int, int]" = OrderedDict()
        self._pins: Dict[int, int] = {}
        self._free: List[int] = list(range(table.max_slots - 1, -1, -1))
        self.slot_of_np = np.full(max_adapter_ids, -1, dtype=np.int64)
        self.slot_of = torch.full((max_adapter_ids,), -1, dtype=torch.long, device=table.device)
        self._stale_counter: Optional[torch.Tensor] = None
        self.stats = {"loads": 0, "evictions": 0, "grown": 0}

    def register(self, adapter_id: int, embeds: torch.Tensor) -> None:
        assert embeds.dim() == 2 and embeds.shape[0] <= self.table.max_virtual_tokens, "soft prompt too long"  # expect: FC109
        self.host_store[adapter_id] = embeds.to(torch.bfloat16).pin_memory()

    def pin(self, adapter_id: int) -> None:
        self._pins[adapter_id] = self._pins.get(adapter_id, 0) + 1

    def unpin(self, adapter_id: int) -> None:
        left = self._pins.get(adapter_id, 0) - 1
        if left <= 0:
            self._pins.pop(adapter_id, None)
        else:
            self._pins[adapter_id] = left

    def ensure_resident(self, adapter_ids_np: np.ndarray, adapter_ids: torch.Tensor) -> np.ndarray:
        """Load every adapter of the batch into a slot; returns the slot of each row (-1: no adapter)."""
        for aid in np.unique(adapter_ids_np[adapter_ids_np >= 0]).tolist():  # ok: FC101
            if aid in self._lru:
                self._lru.move_to_end(aid)
                continue
            slot = self._take_slot()
            self.table.load_slot(slot, self.host_store[aid])
            self._lru[aid] = slot
            self.slot_of_np[aid] = slot
            self.stats["loads"] += 1
        self.slot_of.copy_(torch.from_numpy(self.slot_of_np), non_blocking=True)
        if self._stale_counter is None:
            self._stale_counter = torch.zeros(1, dtype=torch.long, device=self.table.device)  # ok: FC107
        # rows whose adapter lost its slot between scheduling and now
        stale = adapter_ids[self.slot_of[adapter_ids.clamp(min=0)] < 0]  # expect: FC101
        self._stale_counter += stale.numel()
        rows = np.maximum(adapter_ids_np, 0)
        return np.where(adapter_ids_np >= 0, self.slot_of_np[rows], -1)

    def _take_slot(self) -> int:
        if self._free:
            return self._free.pop()
        victim = next((aid for aid in self._lru if self._pins.get(aid, 0) == 0), None)
        if victim is not None:
            slot = self._lru.pop(victim)
            self.slot_of_np[victim] = -1
            self.stats["evictions"] += 1
            return slot
        # every resident soft prompt is pinned by a running request: grow the table
        assert len(self._lru) == self.table.max_slots, "LRU lost track of a slot"  # ok: FC109
        old = self.table.max_slots
        embeds = self.table.embeds
        extra = torch.zeros(self.grow_by, *embeds.shape[1:], dtype=embeds.dtype, device=embeds.device)
        self.table.embeds = torch.cat([embeds, extra])  # expect: FC107
        self.table.max_slots = old + self.grow_by
        self._free.extend(range(self.table.max_slots - 1, old, -1))
        self.stats["grown"] += 1
        return old
