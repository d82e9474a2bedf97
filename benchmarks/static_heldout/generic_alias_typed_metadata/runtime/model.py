"""A decoder-only model whose attention layers reach their backend through a protocol."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from tmeta.config import EngineConfig, ForwardKind

if TYPE_CHECKING:
    from tmeta.generic import AttentionBackend


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def apply_rotary(q: torch.Tensor, positions: torch.Tensor, base: float = 500000.0) -> torch.Tensor:
    half = q.shape[-1] // 2
    inv_freq = 1.0 / (base ** (torch.arange(half, device=q.device, dtype=torch.float32) / half))
    angles = positions.float().unsqueeze(-1) * inv_freq
    cos, sin = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)
    q1, q2 = q[..., :half].float(), q[..., half:].float()
    return torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1).to(q.dtype)


class AttentionLayer(nn.Module):
    def __init__(
        self,
        cfg: EngineConfig,
        layer_id: int,
        attn: "AttentionBackend",
        kv_cache: torch.Tensor,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.kv_cache = kv_cache
        self.num_heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        inner = cfg.num_qo_heads * cfg.head_dim
        self.input_norm = RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.hidden_size, bias=False)
        self.post_norm = RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kind: ForwardKind) -> torch.Tensor:
        q = self.q_proj(self.input_norm(h)).view(-1, self.num_heads, self.head_dim)
        q = apply_rotary(q, positions)
        if kind == "decode":
            o = self.attn.forward_decode(q, self.kv_cache, self.layer_id)
        else:
            o = self.attn.forward_extend(q, self.kv_cache, self.layer_id)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.post_norm(h))


class DecodeModel(nn.Module):
    def __init__(self, cfg: EngineConfig, attn: "AttentionBackend", kv_caches: list[torch.Tensor]) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AttentionLayer(cfg, i, attn, kv_caches[i]) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kind: ForwardKind) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, kind)
        return self.lm_head(self.norm(h))
