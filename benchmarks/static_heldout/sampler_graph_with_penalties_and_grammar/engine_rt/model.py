"""A Gemma-2-shaped decoder: alternating soft-capped local layers and global layers."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from engine_rt.attention import DecodeAttention, DecodeBatch
from engine_rt.config import EngineConfig


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.q_size, self.kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.ln_in = nn.RMSNorm(cfg.hidden_size)
        self.ln_post = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _qkv(self, x, positions, kv_cache, slot_pages, slot_offsets):
        cfg = self.cfg
        q, k, v = self.qkv(self.ln_in(x)).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = _rope(q.view(-1, cfg.num_qo_heads, cfg.head_dim), positions)
        k = _rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions)
        kv_cache[slot_pages, 0, :, slot_offsets] = k
        kv_cache[slot_pages, 1, :, slot_offsets] = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        return q

    def _finish(self, x, o):
        x = x + self.o(o.reshape(x.shape[0], -1))
        g, u = self.gate_up(self.ln_post(x)).chunk(2, dim=-1)
        return x + self.down(F.gelu(g, approximate="tanh") * u)

    def decode_graph(self, x, positions, kv_cache, slot_pages, slot_offsets, attn: DecodeAttention, bs: int):
        q = self._qkv(x, positions, kv_cache, slot_pages, slot_offsets)
        return self._finish(x, attn.forward_graph(q, kv_cache, self.layer_id, bs))

    def decode_eager(self, x, positions, kv_cache, slot_pages, slot_offsets, attn: DecodeAttention,
                     long_batch: Optional[DecodeBatch]):
        q = self._qkv(x, positions, kv_cache, slot_pages, slot_offsets)
        return self._finish(x, attn.forward_eager(q, kv_cache, self.layer_id, long_batch))


class DecodeModel(nn.Module):
    def __init__(self, cfg: EngineConfig, attn: DecodeAttention, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.kv_cache = torch.zeros(cfg.num_layers, cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim,
                                    dtype=cfg.dtype, device=device)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) @ self.embed.weight.t()

    def forward_decode_graph(self, input_ids, positions, slot_pages, slot_offsets, bs: int) -> torch.Tensor:
        x = self.embed(input_ids) * (self.cfg.hidden_size ** 0.5)
        for i, layer in enumerate(self.layers):
            x = layer.decode_graph(x, positions, self.kv_cache[i], slot_pages, slot_offsets, self.attn, bs)
        return self._logits(x)

    def forward_decode_eager(self, input_ids, positions, slot_pages, slot_offsets,
                             long_batch: Optional[DecodeBatch]) -> torch.Tensor:
        x = self.embed(input_ids) * (self.cfg.hidden_size ** 0.5)
        for i, layer in enumerate(self.layers):
            x = layer.decode_eager(x, positions, self.kv_cache[i], slot_pages, slot_offsets, self.attn, long_batch)
        return self._logits(x)
