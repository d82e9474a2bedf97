"""A YOCO decoder-decoder: self-decoder layers (sliding-window attention, their own KV), one projection into the
global KV, then cross-decoder layers that only compute queries against it."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from yoco.attention.cross_backend import CrossAttnBackend
from yoco.attention.window_backend import WindowAttnBackend
from yoco.config import YocoConfig
from yoco.forward_batch import ForwardBatch
from yoco.mem.pools import GlobalKVPool, WindowKVPool


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class SelfDecoderLayer(nn.Module):
    def __init__(self, cfg: YocoConfig, layer_id: int, backend: WindowAttnBackend, pool: WindowKVPool):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.pool = pool
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, qkv, bias=False)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.mlp = SwiGLU(cfg.hidden_size, 14336)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        c = self.cfg
        x = self.norm1(h)
        q, k, v = self.qkv(x).split(
            [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], dim=-1
        )
        q = _rope(q.view(-1, c.num_heads, c.head_dim), positions, c.rope_theta)
        k = _rope(k.view(-1, c.num_kv_heads, c.head_dim), positions, c.rope_theta)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        self.pool.store(self.layer_id, fb.out_cache_loc, k, v)
        attn = self.backend.forward(q, k, v, self.layer_id, fb)
        h = h + self.o(attn.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))


class CrossDecoderLayer(nn.Module):
    def __init__(self, cfg: YocoConfig, backend: CrossAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.q = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.mlp = SwiGLU(cfg.hidden_size, 14336)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        c = self.cfg
        q = _rope(self.q(self.norm1(h)).view(-1, c.num_heads, c.head_dim), positions, c.rope_theta)
        h = h + self.o(self.backend.forward(q, fb).reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))


class YocoForCausalLM(nn.Module):
    def __init__(self, cfg: YocoConfig, window: WindowAttnBackend, cross: CrossAttnBackend,
                 window_pool: WindowKVPool, global_pool: GlobalKVPool):
        super().__init__()
        self.cfg = cfg
        self.cross_backend = cross
        self.global_pool = global_pool
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.self_layers = nn.ModuleList(
            [SelfDecoderLayer(cfg, i, window, window_pool) for i in range(cfg.num_self_layers)]
        )
        self.global_norm = nn.RMSNorm(cfg.hidden_size)
        self.global_kv = nn.Linear(cfg.hidden_size, 2 * cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.cross_layers = nn.ModuleList([CrossDecoderLayer(cfg, cross) for _ in range(cfg.num_cross_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        c = self.cfg
        # padded graph rows carry position -1
        positions = torch.where(positions >= 0, positions, torch.zeros_like(positions))  # ok: FC101
        h = self.embed(input_ids)
        for layer in self.self_layers:
            h = layer(h, positions, fb)
        k, v = self.global_kv(self.global_norm(h)).chunk(2, dim=-1)
        k = _rope(k.reshape(-1, c.num_kv_heads, c.head_dim), positions, c.rope_theta)
        self.global_pool.store(fb.global_cache_loc, k, v.reshape(-1, c.num_kv_heads, c.head_dim))
        rows = self.cross_backend.forward_metadata.rows
        if rows is not None:
            h, positions = h.index_select(0, rows), positions.index_select(0, rows)
        for layer in self.cross_layers:
            h = layer(h, positions, fb)
        return self.lm_head(self.norm(h))
