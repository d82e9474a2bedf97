"""Weight absorption for MLA decode: fold W_UK into the query and W_UV into the output."""

from dataclasses import dataclass

import torch

from mlaserve.config import MLAConfig


@dataclass
class AbsorbedWeights:
    w_uk: torch.Tensor   # [heads, nope, kv_lora_rank]: q_nope @ w_uk -> q in latent space
    w_uv: torch.Tensor   # [heads, kv_lora_rank, v_head_dim]: latent out @ w_uv -> per-head values


def absorb(kv_b_proj: torch.Tensor, cfg: MLAConfig) -> AbsorbedWeights:
    per_head = cfg.qk_nope_head_dim + cfg.v_head_dim
    rows = kv_b_proj.shape[0]
    assert rows == cfg.num_heads * per_head, f"kv_b_proj has {rows} rows"  # expect: FC109
    w = kv_b_proj.view(cfg.num_heads, per_head, cfg.kv_lora_rank)
    w_uk, w_uv = w.split([cfg.qk_nope_head_dim, cfg.v_head_dim], dim=1)
    return AbsorbedWeights(w_uk=w_uk.contiguous(), w_uv=w_uv.transpose(1, 2).contiguous())
