"""Per-request Mamba state slots (conv state + SSM state) for every Mamba layer."""
from __future__ import annotations

from typing import Dict, List

import torch

from jamba.config import JambaConfig

# Padded rows of a captured bucket read and write this slot, never a live request's.
PAD_SLOT = 0


class MambaStatePool:
    """One conv state and one SSM state per request slot, for all Mamba layers at once.

    Slot 0 is reserved for graph padding; live requests get slots ``1..size``.
    """

    def __init__(self, cfg: JambaConfig, num_mamba_layers: int, device: torch.device, dtype: torch.dtype):
        self.size = cfg.max_num_reqs
        self.num_layers = num_mamba_layers
        d_inner = cfg.mamba_d_inner
        self.conv_state = torch.zeros(
            (num_mamba_layers, self.size + 1, d_inner, cfg.mamba_d_conv - 1), dtype=dtype, device=device
        )
        self.ssm_state = torch.zeros(
            (num_mamba_layers, self.size + 1, d_inner, cfg.mamba_d_state), dtype=dtype, device=device
        )
        self.free_slots: List[int] = list(range(1, self.size + 1))
        self.req_to_slot: Dict[str, int] = {}

    def available(self) -> int:
        return len(self.free_slots)

    def alloc(self, rids: List[str]) -> List[int]:
        assert len(rids) <= len(self.free_slots), "out of Mamba state slots"  # expect: FC109
        slots = []
        for rid in rids:
            slot = self.free_slots.pop()
            self.req_to_slot[rid] = slot
            slots.append(slot)
        return slots

    def slot_of(self, rid: str) -> int:
        return self.req_to_slot[rid]

    def slots_of(self, rids: List[str]) -> List[int]:
        return [self.req_to_slot[r] for r in rids]

    def free(self, rid: str) -> None:
        slot = self.req_to_slot.pop(rid)
        self.conv_state[:, slot].zero_()
        self.ssm_state[:, slot].zero_()
        self.free_slots.append(slot)
        self._check_accounting()

    def fork(self, src_rid: str, dst_rid: str) -> int:
        """Parallel sampling: the new request continues from the source's state."""
        src = self.req_to_slot[src_rid]
        dst = self.free_slots.pop()
        self.req_to_slot[dst_rid] = dst
        self.conv_state[:, dst].copy_(self.conv_state[:, src])
        self.ssm_state[:, dst].copy_(self.ssm_state[:, src])
        return dst

    def layer_states(self, mamba_idx: int):
        return self.conv_state[mamba_idx], self.ssm_state[mamba_idx]

    def state_bytes(self) -> int:
        return (self.conv_state.numel() * self.conv_state.element_size()
                + self.ssm_state.numel() * self.ssm_state.element_size())

    def _check_accounting(self) -> None:
        assert len(self.free_slots) + len(self.req_to_slot) == self.size  # ok: FC109
