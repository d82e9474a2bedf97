"""A Llama-shaped decoder whose attention layers call the ``attend`` closure they are handed."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .config import EngineConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    dim = q.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=q.device, dtype=torch.float32) / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float()[..., ::2], x.float()[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
        return out.to(x.dtype)

    return rotate(q), rotate(k)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int):
        super().__init__()
        self.cfg = cfg
        self.is_window = cfg.is_window_layer(layer_id)
        self.input_norm = RMSNorm(cfg.hidden_size)
        self.post_norm = RMSNorm(cfg.hidden_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=False)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=False)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        kv_cache: torch.Tensor,
        attend: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        cfg = self.cfg
        x = self.input_norm(h)
        q, k, v = self.qkv_proj(x).split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(-1, cfg.num_qo_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        q, k = apply_rope(q, k, positions, cfg.rope_theta)
        # NHD paged cache: [num_pages, 2, page_size, num_kv_heads, head_dim]
        page, offset = out_cache_loc // cfg.page_size, out_cache_loc % cfg.page_size
        kv_cache[page, 0, offset] = k
        kv_cache[page, 1, offset] = v
        o = attend(q, k, v, kv_cache)
        h = h + self.o_proj(o.reshape(-1, cfg.q_size))
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class DecoderModel(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        out_cache_loc: torch.Tensor,
        kv_caches: list[torch.Tensor],
        attend: Callable[..., torch.Tensor],
        attend_window: Callable[..., torch.Tensor],
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(h, positions, out_cache_loc, kv_cache, attend_window if layer.is_window else attend)
        return self.lm_head(self.norm(h))
