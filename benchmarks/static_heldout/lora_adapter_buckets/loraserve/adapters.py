"""Adapter weight slots kept on the device; a captured graph reads them by address."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .constants import MAX_LORA_RANK, AdapterKind

logger = logging.getLogger(__name__)


@dataclass
class AdapterWeights:
    adapter_id: int
    kind: AdapterKind
    a: torch.Tensor
    b: torch.Tensor


class AdapterSlots:
    def __init__(self, num_slots: int, hidden: int, device: torch.device) -> None:
        self.device = device
        self.slot_of: dict[int, int] = {}
        self.lora_a: dict[int, torch.Tensor] = {
            s: torch.zeros(MAX_LORA_RANK, hidden, dtype=torch.float16, device=device) for s in range(num_slots)
        }
        self.lora_b: dict[int, torch.Tensor] = {
            s: torch.zeros(hidden, MAX_LORA_RANK, dtype=torch.float16, device=device) for s in range(num_slots)
        }

    def activate(self, slot: int, weights: AdapterWeights) -> None:
        self.slot_of[weights.adapter_id] = slot
        self.lora_a[slot] = weights.a.to(self.device).clone()  # expect: FC107
        self.lora_b[slot][:, : weights.b.shape[1]].copy_(weights.b, non_blocking=True)  # ok: FC107
        logger.debug("adapter %d -> slot %d", weights.adapter_id, slot)
