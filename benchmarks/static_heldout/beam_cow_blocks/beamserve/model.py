"""A Qwen2-shaped decoder with a graph-captured beam decode and an eager one."""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from beamserve.attention import BeamDecodeBackend
from beamserve.config import BeamConfig


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 1000000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None, None] * inv
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1).to(x.dtype)


class BeamAttention(nn.Module):
    def __init__(self, cfg: BeamConfig, backend: BeamDecodeBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        q_size, kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=True)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.sizes = [q_size, kv_size, kv_size]

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(h).split(self.sizes, dim=-1)
        q = rope(q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim), positions)
        k = rope(k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim), positions)
        return q, k, v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)

    def decode(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, padded: int):
        q, k, v = self._qkv(h, positions)
        self.backend.store_kv(kv_cache, k, v, h.shape[0])
        o_sfx, lse_sfx = self.backend.forward_decode(q, kv_cache, padded)
        o_pfx, lse_pfx = self.backend.forward_prefix(q, kv_cache)
        return self.o_proj(self.backend.merge(o_sfx, lse_sfx, o_pfx, lse_pfx).flatten(1))

    def decode_eager(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor):
        q, k, v = self._qkv(h, positions)
        self.backend.store_kv(kv_cache, k, v, h.shape[0])
        o_sfx, lse_sfx = self.backend.forward_decode_eager(q, kv_cache)
        o_pfx, lse_pfx = self.backend.forward_prefix(q, kv_cache)
        return self.o_proj(self.backend.merge(o_sfx, lse_sfx, o_pfx, lse_pfx).flatten(1))


class BeamLayer(nn.Module):
    def __init__(self, cfg: BeamConfig, backend: BeamDecodeBackend):
        super().__init__()
        self.attn = BeamAttention(cfg, backend)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(self.ln2(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(g) * u)

    def decode(self, h, positions, kv_cache, padded: int):
        return self._mlp(h + self.attn.decode(self.ln1(h), positions, kv_cache, padded))

    def decode_eager(self, h, positions, kv_cache):
        return self._mlp(h + self.attn.decode_eager(self.ln1(h), positions, kv_cache))


class BeamDecoder(nn.Module):
    def __init__(self, cfg: BeamConfig, backend: BeamDecodeBackend, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([BeamLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, padded: int, out: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, positions, kv, padded)
        out.copy_(self.lm_head(self.norm(h)).float())
        return out

    def decode_eager(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode_eager(h, positions, kv)
        return self.lm_head(self.norm(h)).float()
