"""A Llama-shaped decoder whose attention is delegated to the engine's backend.

Layers receive the step's metadata record (``meta``) unchanged and hand it to the backend; they
never look inside it except for the slots they own (``out_cache_loc``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    d = q.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=q.device, dtype=torch.float32) / d))
    ang = positions.float().unsqueeze(-1) * inv
    cos, sin = ang.cos().unsqueeze(1), ang.sin().unsqueeze(1)

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rot(q), rot(k)


class Attention(nn.Module):
    def __init__(self, cfg: SimpleNamespace, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        # Gemma-style alternation: even layers are local when the model has a window.
        self.sliding_window = cfg.sliding_window if (cfg.sliding_window > 0 and layer_id % 2 == 0) else -1
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.backend: Any = None

    @property
    def kv_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_cache, self.v_cache

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, out_cache_loc: torch.Tensor) -> None:
        # k_cache / v_cache: [num_pages, page_size, num_kv_heads, head_dim] (NHD); loc = page * page_size + slot
        self.k_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, out_cache_loc, k)
        self.v_cache.view(-1, self.num_kv_heads, self.head_dim).index_copy_(0, out_cache_loc, v)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        sizes = [self.num_qo_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim]
        q, k, v = self.qkv_proj(h).split(sizes, dim=-1)
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = apply_rope(q, k, positions)
        o = self.backend.forward(q, k, v, self, meta)
        return self.o_proj(o.reshape(-1, self.num_qo_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: SimpleNamespace, layer_id: int):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size)
        self.attn = Attention(cfg, layer_id)
        self.post_norm = RMSNorm(cfg.hidden_size)
        self.mlp = MLP(cfg.hidden_size, cfg.hidden_size * 11 // 4)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        h = h + self.attn(self.input_norm(h), positions, meta)
        return h + self.mlp(self.post_norm(h))


class MTPHead(nn.Module):
    """One-token multi-token-prediction head: a query over the target's last-layer pages."""

    def __init__(self, cfg: SimpleNamespace):
        super().__init__()
        self.num_qo_heads, self.head_dim = cfg.num_qo_heads, cfg.head_dim
        self.norm = RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.backend: Any = None
        self.kv_cache: Any = None

    def forward(self, hidden: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        q = self.q_proj(self.norm(hidden)).view(-1, self.num_qo_heads, self.head_dim)
        o = self.backend.forward_draft(q, self.kv_cache, meta)
        return hidden + self.o_proj(o.reshape(-1, self.num_qo_heads * self.head_dim))


class Model(nn.Module):
    def __init__(self, cfg: SimpleNamespace):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = MTPHead(cfg) if cfg.enable_mtp_draft else None

    def bind(self, backend: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches):
            layer.attn.backend = backend
            layer.attn.k_cache, layer.attn.v_cache = k_cache, v_cache
        if self.mtp is not None:
            self.mtp.backend = backend
            self.mtp.kv_cache = kv_caches[-1]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, meta)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def draft_forward(self, hidden: torch.Tensor, meta: SimpleNamespace) -> torch.Tensor:
        return self.compute_logits(self.mtp(hidden, meta))
