"""Copies of the next layer's weights on a side stream, one layer ahead of the compute."""

from typing import List

import flashcheck
import torch

from wstream.host_weights import HostWeightStore
from wstream.lru import DeviceLayerLRU


class Prefetcher:
    def __init__(self, store: HostWeightStore, lru: DeviceLayerLRU, num_layers: int):
        self.store = store
        self.lru = lru
        self.side = torch.cuda.Stream()
        self.ready: List[torch.cuda.Event] = [torch.cuda.Event() for _ in range(num_layers)]
        self.freed: List[torch.cuda.Event] = [torch.cuda.Event() for _ in range(lru.num_slots)]

    @flashcheck.hot_path
    def issue(self, layer: int) -> int:
        slot, hit = self.lru.acquire(layer)
        if hit:
            return slot
        host_w = self.store.layer(layer)
        self.lru.ensure_capacity(slot, host_w.numel())
        with torch.cuda.stream(self.side):
            # the slot's previous layer may still be read by the compute stream
            self.side.wait_event(self.freed[slot])  # ok: FC101
            self.lru.slots[slot][: host_w.numel()].copy_(host_w, non_blocking=True)
            self.ready[layer].record(self.side)
        return slot
