"""Adapter weights: pinned host copies of every adapter, device slot buffers the graphs read."""

from __future__ import annotations

import collections
from typing import Dict, Set, Tuple

import numpy as np
import torch

from loraslots.config import SlotConfig

ZERO_SLOT = 0  # rows without an adapter gather this all-zero slot


class AdapterStore:
    """Every registered adapter, A and B^T packed as ``[layers, 2, hidden, rank]`` in pinned memory."""

    def __init__(self, cfg: SlotConfig) -> None:
        self.cfg = cfg
        self._packed: Dict[int, torch.Tensor] = {}
        self.ranks: Dict[int, int] = {}
        self.scales: Dict[int, float] = {}
        self.prefix_tokens: Dict[int, Tuple[int, ...]] = {}

    def register(
        self,
        adapter_id: int,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        alpha: float,
        prefix: Tuple[int, ...] = (),
    ) -> None:
        assert lora_a.shape[-1] == lora_b.shape[-2], "A and B disagree on the rank"  # expect: FC109
        rank = lora_a.shape[-1]
        packed = torch.stack([lora_a, lora_b.transpose(-1, -2)], dim=1).to(torch.float16)
        self._packed[adapter_id] = packed.contiguous().pin_memory()
        self.ranks[adapter_id] = rank
        self.scales[adapter_id] = alpha / rank
        self.prefix_tokens[adapter_id] = tuple(prefix)

    def __contains__(self, adapter_id: int) -> bool:
        return adapter_id in self._packed

    def packed(self, adapter_id: int) -> torch.Tensor:
        return self._packed[adapter_id]


class AdapterSlotTable:
    """The slot buffers every captured decode graph gathers from.

    ``lora_ab[layer, slot]`` holds A and B^T of the adapter resident in ``slot``, zero-padded to ``max_rank``;
    ``scaling[slot]`` is its alpha / rank. A graph reads these by address through the runner's static slot ids,
    so a swap is a copy into a slot between two replays, never a new tensor.
    """

    def __init__(self, cfg: SlotConfig, device: torch.device) -> None:
        self.num_slots = cfg.num_slots
        self.max_rank = cfg.max_rank
        self.lora_ab = torch.zeros(
            cfg.num_layers, cfg.num_slots, 2, cfg.hidden_size, cfg.max_rank, dtype=torch.float16, device=device
        )
        self.scaling = torch.zeros(cfg.num_slots, dtype=torch.float16, device=device)
        self.ranks_dev = torch.zeros(cfg.num_slots, dtype=torch.int32, device=device)
        self.slot_adapter_dev = torch.full((cfg.num_slots,), -1, dtype=torch.int32, device=device)
        self.slot_adapter_np = np.full(cfg.num_slots, -1, dtype=np.int64)
        self.slot_adapter_np[ZERO_SLOT] = -2
        self._lru: "collections.OrderedDict[int, None]" = collections.OrderedDict()

    def slot_of(self, adapter_id: int) -> int:
        hits = np.flatnonzero(self.slot_adapter_np == adapter_id)
        if hits.size == 0:
            return -1
        slot = int(hits[0])
        self._lru.move_to_end(slot)
        return slot

    def lru_victim(self, pinned: Set[int]) -> int:
        for slot in self._lru:
            if slot not in pinned:
                return slot
        raise RuntimeError(
            f"all {self.num_slots - 1} adapter slots are used by the next batch; lower the adapters per batch"
        )

    def write_slot(self, slot: int, adapter_id: int, staged: torch.Tensor, rank: int, scale: float) -> None:
        """Called on the copy stream; ``staged`` is the adapter already copied to the device."""
        self.lora_ab[:, slot].zero_()
        self.lora_ab[:, slot, :, :, :rank].copy_(staged, non_blocking=True)
        self.scaling[slot] = scale
        self.ranks_dev[slot] = rank
        self.slot_adapter_dev[slot] = adapter_id  # ok: FC104
        self.slot_adapter_np[slot] = adapter_id
        self._lru[slot] = None
        self._lru.move_to_end(slot)

    def clear_slot(self, slot: int) -> None:
        self.slot_adapter_np[slot] = -1
        self.slot_adapter_dev[slot] = -1
        self._lru.pop(slot, None)
