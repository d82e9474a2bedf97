"""Decoder layers receive their attention backend through the constructor."""
from __future__ import annotations

import torch
from torch import nn

from ubr import ModelConfig
from ubr_backends.registry import AttnBackend


class AttentionLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, backend: AttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.num_qo_heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self,
        h: torch.Tensor,
        kv_cache: torch.Tensor,
        valid: torch.Tensor,
    ) -> torch.Tensor:
        q = self.q_proj(self.norm(h)).view(-1, self.num_qo_heads, self.head_dim)
        o = self.backend.forward_decode(q, kv_cache)
        if torch.isnan(o).any():  # expect: FC101
            raise FloatingPointError("attention produced NaN")
        o = torch.where(valid[:, None, None], o, torch.zeros_like(o))  # ok: FC101
        return self.o_proj(o.reshape(h.shape[0], -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        inter = cfg.hidden_size * 4
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.up = nn.Linear(cfg.hidden_size, 2 * inter, bias=False)
        self.down = nn.Linear(inter, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.up(self.norm(h)).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)
