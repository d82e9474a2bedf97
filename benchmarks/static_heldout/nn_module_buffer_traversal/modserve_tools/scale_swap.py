"""Swap per-layer KV-cache scales between steps.

Layers are addressed by their module path (``model.layers.3.self_attn.attn``) as the
calibration service reports them; the scales are the ``k_scale`` / ``v_scale``
buffers of each ``PagedAttention``.
"""

from __future__ import annotations

from typing import Dict, Set

import torch
from torch import nn

from modserve.layers.attention import PagedAttention


def swap_module_buffer(model: nn.Module, path: str, name: str, value: torch.Tensor) -> None:
    """Replace the buffer ``name`` of the submodule at ``path`` with a copy of ``value``."""
    mod = model.get_submodule(path)
    old = mod.get_buffer(name)
    assert value.shape == old.shape, f"{path}.{name}: shape {tuple(value.shape)} != {tuple(old.shape)}"  # expect: FC109
    setattr(mod, name, value.to(device=old.device, dtype=old.dtype).clone())  # expect: FC107


class KVScaleSwapper:
    def __init__(self, model: nn.Module):
        self.model = model
        self._attn_paths: Set[str] = {
            name for name, mod in model.named_modules() if isinstance(mod, PagedAttention)
        }

    def apply_updates(self, updates: Dict[str, torch.Tensor]) -> None:
        """``updates`` maps a layer path to a (2,) tensor of (k_scale, v_scale) on the device."""
        assert set(updates) <= self._attn_paths, "scale update for a module that is not an attention layer"  # expect: FC109
        for path, scales in updates.items():
            mod = self.model.get_submodule(path)
            if torch.equal(mod.get_buffer("k_scale"), scales[:1]):  # expect: FC101
                continue
            swap_module_buffer(self.model, path, "k_scale", scales[:1])
            mod.get_buffer("v_scale").copy_(scales[1:], non_blocking=True)  # ok: FC107
