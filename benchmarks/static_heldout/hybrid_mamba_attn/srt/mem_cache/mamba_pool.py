"""Per-request recurrent state of the linear-attention layers (conv window + SSM/delta-rule state)."""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence, Union

import numpy as np
import torch

logger = logging.getLogger(__name__)


class MambaPool:
    """Slot 0 is a scratch slot: padded rows of a captured batch point at it, so they never clobber live state."""

    def __init__(self, size: int, num_layers: int, conv_shape, temporal_shape, dtype, device: torch.device):
        self.size = size
        self.num_layers = num_layers
        self.device = device
        self.conv_state = torch.zeros((num_layers, size + 1) + tuple(conv_shape), dtype=dtype, device=device)
        self.temporal_state = torch.zeros((num_layers, size + 1) + tuple(temporal_shape), dtype=torch.float32, device=device)
        # request pool index -> state slot, read by the kernels (device) and by the scheduler (host mirror)
        self.req_to_slot = torch.zeros(4 * size, dtype=torch.int32, device=device)
        self.req_to_slot_np = np.zeros(4 * size, dtype=np.int32)
        self.free_slots: List[int] = list(range(1, size + 1))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, req_pool_indices: Sequence[int]) -> Optional[List[int]]:
        if len(req_pool_indices) > len(self.free_slots):
            return None
        slots, self.free_slots = self.free_slots[: len(req_pool_indices)], self.free_slots[len(req_pool_indices) :]
        self.req_to_slot_np[list(req_pool_indices)] = slots
        self.req_to_slot[torch.as_tensor(list(req_pool_indices), dtype=torch.int64).to(self.device, non_blocking=True)] = (
            torch.as_tensor(slots, dtype=torch.int32).to(self.device, non_blocking=True)
        )
        return slots

    def free(self, slots: Union[int, List[int]]) -> None:
        if isinstance(slots, int):
            slots = [slots]
        self.free_slots.extend(slots)
        self._debug_check()

    def zero_states(self, slots: torch.Tensor) -> None:
        """Fresh prompts must not read what the previous owner of the slot left behind."""
        self.conv_state[:, slots] = 0
        self.temporal_state[:, slots] = 0

    def copy_from(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
        """Fork the state of `src_slots` into `dst_slots` (prefix sharing, speculative branches)."""
        assert src_slots.shape == dst_slots.shape  # expect: FC109
        self.conv_state[:, dst_slots] = self.conv_state[:, src_slots]
        self.temporal_state[:, dst_slots] = self.temporal_state[:, src_slots]

    def _debug_check(self) -> None:
        assert len(self.free_slots) <= self.size, (len(self.free_slots), self.size)  # ok: FC109
        if len(set(self.free_slots)) != len(self.free_slots):
            logger.error("double free in MambaPool: %d duplicated slots", len(self.free_slots) - len(set(self.free_slots)))
