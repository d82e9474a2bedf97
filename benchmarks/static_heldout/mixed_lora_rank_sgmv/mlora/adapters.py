"""GPU slots for LoRA adapters of different ranks.

All slots are padded to the current maximum rank so one SGMV launch serves the whole batch; slot 0 is the base model
(rank 0, zero weights). Adapters are swapped into slots between steps.
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    rank: int
    alpha: float
    target_modules: Tuple[str, ...] = ("qkv_proj", "o_proj")
    num_vtokens: int = 0          # prompt-tuning adapters carry learned virtual tokens

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank


class AdapterSlotTable:
    def __init__(self, num_slots: int, hidden: int, num_layers: int, max_rank: int, device: torch.device, dtype: torch.dtype = torch.float16):
        self.num_slots = num_slots
        self.hidden = hidden
        self.num_layers = num_layers
        self.max_rank = max_rank
        self.device = device
        self.dtype = dtype
        self.lora_a = torch.zeros(num_layers, num_slots, max_rank, hidden, dtype=dtype, device=device)
        self.lora_b = torch.zeros(num_layers, num_slots, hidden, max_rank, dtype=dtype, device=device)
        self.slot_ranks = torch.zeros(num_slots, dtype=torch.int32, device=device)
        self.slot_scalings = torch.zeros(num_slots, dtype=torch.float32, device=device)
        self.slot_ranks_cpu = torch.zeros(num_slots, dtype=torch.int32)
        self.name_to_slot: Dict[str, int] = {}
        self.slot_names: List[Optional[str]] = [None] * num_slots
        self.last_used = np.zeros(num_slots, dtype=np.int64)
        self.clock = 0

    def touch(self, slots_np: np.ndarray) -> None:
        self.clock += 1
        self.last_used[slots_np] = self.clock

    def pick_victim(self) -> int:
        free = [s for s in range(1, self.num_slots) if self.slot_names[s] is None]
        if free:
            return free[0]
        return 1 + int(np.argmin(self.last_used[1:]))

    def load(self, spec: AdapterSpec, slot: int, weights_a: torch.Tensor, weights_b: torch.Tensor) -> None:
        assert 0 < slot < self.num_slots, f"slot {slot} outside 1..{self.num_slots - 1}"  # expect: FC109
        if spec.rank > self.max_rank:
            # a higher-rank adapter arrived: re-pad every slot to the new rank
            pad = spec.rank - self.max_rank
            self.lora_a = torch.cat([self.lora_a, self.lora_a.new_zeros(self.num_layers, self.num_slots, pad, self.hidden)], dim=2)  # expect: FC107
            self.lora_b = torch.cat([self.lora_b, self.lora_b.new_zeros(self.num_layers, self.num_slots, self.hidden, pad)], dim=3)  # expect: FC107
            self.max_rank = spec.rank
        r = spec.rank
        self.lora_a[:, slot].zero_()
        self.lora_b[:, slot].zero_()
        self.lora_a[:, slot, :r].copy_(weights_a, non_blocking=True)
        self.lora_b[:, slot, :, :r].copy_(weights_b, non_blocking=True)
        self.slot_ranks_cpu[slot] = r
        self.slot_ranks[slot] = r
        self.slot_scalings[slot] = spec.scaling
        old = self.slot_names[slot]
        if old is not None:
            del self.name_to_slot[old]
        self.slot_names[slot] = spec.name
        self.name_to_slot[spec.name] = slot
        self._check_slots()

    def _check_slots(self) -> None:
        assert self.slot_names[0] is None and len(self.name_to_slot) < self.num_slots, "slot 0 is the base model"  # ok: FC109
