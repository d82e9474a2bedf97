"""Merging the partial attention of the shards with their log-sum-exps (base 2)."""
from __future__ import annotations

from typing import Tuple

import torch
from flashinfer import merge_state


def merge_partial_states(outs: torch.Tensor, lses: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``outs``: [W, T, H, D] partial outputs, ``lses``: [W, T, H] as FlashInfer returns them."""
    assert outs.shape[:3] == lses.shape, "partial outputs and LSEs of the shards disagree"  # expect: FC109
    if outs.shape[0] == 2:
        return merge_state(outs[0], lses[0], outs[1], lses[1])
    lse_max = lses.amax(dim=0)
    lse_max = torch.where(torch.isfinite(lse_max), lse_max, torch.zeros_like(lse_max))  # ok: FC101
    w = torch.exp2(lses - lse_max[None])
    denom = w.sum(dim=0)
    out = (outs.float() * w[..., None]).sum(dim=0) / denom.clamp(min=1e-30)[..., None]
    return out.to(outs.dtype), lse_max + torch.log2(denom)
