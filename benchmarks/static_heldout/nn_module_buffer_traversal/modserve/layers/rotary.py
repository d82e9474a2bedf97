"""Neox-style rotary embedding with its cos/sin table kept as a module buffer."""

from __future__ import annotations

import torch
from torch import nn


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int) -> torch.Tensor:
    t = x.shape[0]
    x = x.view(t, -1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.view(t, -1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float):
        super().__init__()
        self.head_dim = head_dim
        self.max_position = max_position
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_sin_cache", self.build_cache(max_position), persistent=False)

    def build_cache(self, n: int) -> torch.Tensor:
        t = torch.arange(n, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)
        return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos_sin = self.cos_sin_cache.index_select(0, positions)
        cos, sin = cos_sin.chunk(2, dim=-1)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return _apply_rope(q, cos, sin, self.head_dim), _apply_rope(k, cos, sin, self.head_dim)
