"""Device slots holding whole layers, evicted least-recently-used first."""

from typing import Callable, List, Set, Tuple

import numpy as np
import torch

from wstream.host_weights import LayerWeights


class DeviceLayerLRU:
    def __init__(self, num_slots: int, slot_numel: int, num_layers: int, dtype: torch.dtype,
                 device: torch.device, splitter: Callable[[torch.Tensor], LayerWeights]):
        assert num_slots >= 2, "one slot computes while the next one fills"  # expect: FC109
        self.num_slots = num_slots
        self.dtype = dtype
        self.device = device
        self.splitter = splitter
        self.slots: List[torch.Tensor] = []
        for _ in range(num_slots):
            self.slots.append(torch.empty(slot_numel, dtype=dtype, device=device))
        self.slot_of_np = np.full(num_layers, -1, dtype=np.int64)
        self.slot_of_dev = torch.full((num_layers,), -1, dtype=torch.int64, device=device)
        self.resident_np = np.zeros(num_layers, dtype=bool)
        self.resident_dev = torch.zeros(num_layers, dtype=torch.bool, device=device)
        self.layer_in_slot = [-1] * num_slots
        self.order: List[int] = list(range(num_slots))  # LRU first
        self.pinned: Set[int] = set()

    def _touch(self, slot: int) -> None:
        if slot in self.order:
            self.order.remove(slot)
            self.order.append(slot)

    def _evict(self) -> int:
        assert self.order, "every slot is pinned by a resident layer"  # ok: FC109
        slot = self.order.pop(0)
        old = self.layer_in_slot[slot]
        if old >= 0:
            self.slot_of_np[old] = -1
            self.resident_np[old] = False
            self.slot_of_dev[old] = -1
            self.resident_dev[old] = False
        self.order.append(slot)
        return slot

    def pin(self, layer: int) -> None:
        slot = int(self.slot_of_np[layer])
        self.pinned.add(slot)
        self.order.remove(slot)

    def acquire(self, layer: int) -> Tuple[int, bool]:
        slot = int(self.slot_of_np[layer])  # ok: FC101
        if slot >= 0:
            self._touch(slot)
            return slot, True
        slot = self._evict()
        self.layer_in_slot[slot] = layer
        self.slot_of_np[layer] = slot
        self.resident_np[layer] = True
        self.slot_of_dev[layer] = slot
        self.resident_dev[layer] = True
        return slot, False

    def ensure_capacity(self, slot: int, numel: int) -> None:
        if self.slots[slot].numel() < numel:
            self.slots[slot] = torch.empty(numel, dtype=self.dtype, device=self.device)  # expect: FC107

    def lookup(self, layer: int) -> int:
        return int(self.slot_of_dev[layer])  # expect: FC101

    def view(self, slot: int) -> LayerWeights:
        return self.splitter(self.slots[slot])
