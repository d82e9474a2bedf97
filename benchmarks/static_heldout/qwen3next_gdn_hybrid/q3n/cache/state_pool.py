"""Per-request conv and recurrent states of the gated delta-net layers, indexed by request slot."""
from __future__ import annotations

import logging
from typing import Dict, Tuple

import numpy as np
import torch

from q3n.schema import EngineLimits, Qwen3NextConfig

logger = logging.getLogger(__name__)

# Padded rows of a replayed decode graph read and write this slot; no request ever owns it.
PADDING_SLOT = 0


class MambaStatePool:
    """One slot per running request: a rolling conv window and a [H, K, V] recurrent state per linear layer."""

    def __init__(self, cfg: Qwen3NextConfig, limits: EngineLimits, device: torch.device):
        self.device = device
        self.num_linear_layers = len(cfg.linear_attention_layers())
        self.size = limits.max_running_requests + 1
        self.conv_state = torch.zeros(
            self.num_linear_layers,
            self.size,
            cfg.conv_dim,
            cfg.linear_conv_kernel_dim - 1,
            dtype=torch.bfloat16,
            device=device,
        )
        self.ssm_state = torch.zeros(
            self.num_linear_layers,
            self.size,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
            dtype=torch.float32,
            device=device,
        )
        self.slot_free = torch.ones(self.size, dtype=torch.bool, device=device)
        self.slot_free[PADDING_SLOT] = False
        self.num_free = self.size - 1
        self.num_used = 0

    def layer_states(self, linear_idx: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.conv_state[linear_idx], self.ssm_state[linear_idx]

    def alloc(self, num: int) -> torch.Tensor:
        """Reserve `num` slots for newly admitted requests and clear their states."""
        assert num <= self.num_free, "mamba state pool exhausted"  # expect: FC109
        free = torch.nonzero(self.slot_free).squeeze(1)  # expect: FC101
        slots = free[:num]
        self.slot_free[slots] = False
        self.conv_state[:, slots] = 0
        self.ssm_state[:, slots] = 0
        self.num_free -= num
        self.num_used += num
        self._check_accounting()
        return slots

    def free(self, slots: torch.Tensor, count: int) -> None:
        self.slot_free[slots] = True
        self.num_free += count
        self.num_used -= count
        self._check_accounting()

    def _check_accounting(self) -> None:
        assert self.num_free + self.num_used == self.size - 1, "slot accounting drifted"  # ok: FC109

    def bytes_per_slot(self) -> int:
        conv = self.conv_state[:, 0].numel() * self.conv_state.element_size()
        ssm = self.ssm_state[:, 0].numel() * self.ssm_state.element_size()
        return conv + ssm

    def debug_snapshot(self, slot: int) -> Dict[str, np.ndarray]:
        """Copy one request's states to the host for the /debug/state endpoint."""
        conv = self.conv_state[:, slot].float().cpu().numpy()  # ok: FC101
        ssm_norm = torch.linalg.vector_norm(self.ssm_state[:, slot], dim=(-2, -1)).cpu().numpy()
        return {"conv": conv, "ssm_norm": ssm_norm}
