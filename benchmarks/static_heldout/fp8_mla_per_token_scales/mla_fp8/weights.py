"""Weight absorption: W_UK folds into the query, W_UV into the output, so attention runs in the latent."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AbsorbedWeights:
    w_uk: torch.Tensor  # (heads, qk_nope, kv_lora_rank)
    w_uv: torch.Tensor  # (heads, kv_lora_rank, v_head_dim)


def absorb_kv_b(w_kv_b: torch.Tensor, num_heads: int, qk_nope: int, v_dim: int, kv_lora_rank: int) -> AbsorbedWeights:
    assert w_kv_b.shape == (num_heads * (qk_nope + v_dim), kv_lora_rank), "unexpected kv_b_proj shape"  # expect: FC109
    w = w_kv_b.view(num_heads, qk_nope + v_dim, kv_lora_rank)
    return AbsorbedWeights(w[:, :qk_nope, :].contiguous(), w[:, qk_nope:, :].transpose(1, 2).contiguous())
