"""Logical-to-physical expert placement: a device table the MoE layers gather from, and its host copy."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn


class ExpertPlacement:
    def __init__(self, num_layers: int, num_experts: int, device: torch.device):
        self.device = device
        self.map_np = np.tile(np.arange(num_experts, dtype=np.int64), (num_layers, 1))
        self.logical_to_physical = torch.from_numpy(self.map_np.copy()).to(device)

    def _migrate(self, layer_weights: Sequence[Sequence[nn.Parameter]], new_map_np: np.ndarray) -> None:
        # Physical slot p of the new layout holds the expert that the old layout kept in slot src[p].
        for layer, params in enumerate(layer_weights):
            src = np.empty_like(new_map_np[layer])
            src[new_map_np[layer]] = self.map_np[layer]
            src_t = torch.from_numpy(src).to(self.device, non_blocking=True)
            for p in params:
                p.data.copy_(p.data.index_select(0, src_t))

    def apply(self, new_map_np: np.ndarray, layer_weights: Sequence[Sequence[nn.Parameter]]) -> bool:
        assert new_map_np.shape == self.map_np.shape, "placement must cover every layer and expert"  # expect: FC109
        if np.array_equal(new_map_np, self.map_np):  # ok: FC101
            return False
        proposed = torch.from_numpy(new_map_np).to(self.device, non_blocking=True)
        if torch.equal(proposed, self.logical_to_physical):  # expect: FC101
            return False
        self._migrate(layer_weights, new_map_np)
        self.logical_to_physical.copy_(proposed)
        self.map_np[...] = new_map_np
        return True
