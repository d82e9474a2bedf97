"""Weight absorption for MLA decode: W_UK folded into the query, W_UV into the output."""
from __future__ import annotations

from typing import Tuple

import torch


def absorb_weights(w_kc: torch.Tensor, w_vc: torch.Tensor, num_heads: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Split ``kv_b_proj`` into per-head W_UK (heads, nope, lora) and W_UV (heads, lora, v)."""
    assert w_kc.shape[0] == num_heads  # expect: FC109
    return w_kc.contiguous(), w_vc.transpose(1, 2).contiguous()


@torch.compile(dynamic=True)
def absorb_query(q_nope: torch.Tensor, w_kc: torch.Tensor) -> torch.Tensor:
    return torch.bmm(q_nope.transpose(0, 1), w_kc).transpose(0, 1)


@torch.compile(dynamic=True)
def absorb_output(o_latent: torch.Tensor, w_vc: torch.Tensor) -> torch.Tensor:
    return torch.bmm(o_latent.transpose(0, 1), w_vc).transpose(0, 1).flatten(1)


@torch.jit.script
def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    assert x.size(-1) % 2 == 0  # ok: FC109
    x1 = x[..., 0::2]
    x2 = x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
