"""A small decoder whose attention goes through DecodeAttention."""
from __future__ import annotations

import torch
from torch import nn

from lpserve.attn.decode import DecodeAttention
from lpserve.config import ServeConfig
from lpserve.kv import PagePool


class DecodeLayer(nn.Module):
    def __init__(self, cfg: ServeConfig, attn: DecodeAttention, pool: PagePool, layer_id: int):
        super().__init__()
        self.attn = attn
        self.pool = pool
        self.layer_id = layer_id
        self.h, self.kv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kv) * self.d, bias=False, dtype=cfg.dtype)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False, dtype=cfg.dtype)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False, dtype=cfg.dtype),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False, dtype=cfg.dtype),
        )

    def _qkv(self, h: torch.Tensor):
        q, k, v = self.qkv(self.norm(h)).split([self.h * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        return q.view(-1, self.h, self.d), k.view(-1, self.kv, self.d), v.view(-1, self.kv, self.d)

    def forward(self, h: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = self._qkv(h)
        self.pool.write_decode_kv(self.layer_id, k, v, bs)
        o = self.attn.forward_decode(self.layer_id, q, bs)
        h = h + self.o_proj(o.reshape(bs, -1))
        return h + self.mlp(h)

    def prefill(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h)
        self.pool.write_prefill_kv(self.layer_id, k, v)
        o = self.attn.forward_prefill(self.layer_id, q)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class DecoderModel(nn.Module):
    def __init__(self, cfg: ServeConfig, attn: DecodeAttention, pool: PagePool):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        self.pos_embed = nn.Embedding(cfg.max_context_len, cfg.hidden_size, dtype=cfg.dtype)
        self.layers = nn.ModuleList([DecodeLayer(cfg, attn, pool, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=cfg.dtype)

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(ids) + self.pos_embed(positions)
        for layer in self.layers:
            h = layer(h, bs)
        return self.lm_head(self.norm(h))

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.pos_embed(positions)
        for layer in self.layers:
            h = layer.prefill(h)
        return self.lm_head(self.norm(h))
