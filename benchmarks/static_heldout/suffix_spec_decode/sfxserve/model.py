"""A Llama-shaped target model with separate prefill, verify and decode entry points."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from sfxserve.attention.verify_backend import VerifyAttention
from sfxserve.config import SpecConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class SpecBlock(nn.Module):
    def __init__(self, cfg: SpecConfig, layer_id: int, attn: VerifyAttention):
        super().__init__()
        self.layer_id = layer_id
        self.attn_backend = attn
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.norm1 = RMSNorm(hidden)
        self.norm2 = RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden, bias=False), nn.SiLU(), nn.Linear(4 * hidden, hidden, bias=False))
        self.kv_cache: torch.Tensor = torch.empty(0)

    def _qkv(self, h: torch.Tensor):
        qkv = self.qkv(self.norm1(h))
        q, k, v = qkv.split(
            [self.num_qo_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim], dim=-1
        )
        return q.view(-1, self.num_qo_heads, self.head_dim), k, v

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))

    def prefill(self, h: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._qkv(h)
        return self._finish(h, self.attn_backend.prefill_attend(q, self.kv_cache))

    def verify(self, h: torch.Tensor, bucket: int) -> torch.Tensor:
        q, _, _ = self._qkv(h)
        return self._finish(h, self.attn_backend.verify_attend(q, self.kv_cache, bucket))

    def decode(self, h: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._qkv(h)
        return self._finish(h, self.attn_backend.decode_attend(q, self.kv_cache, block_tables))


class SpecModel(nn.Module):
    def __init__(self, cfg: SpecConfig, attn: VerifyAttention):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([SpecBlock(cfg, i, attn) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def prefill_forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.prefill(h)
        return self.lm_head(self.norm(h))

    def verify_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, bucket: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.verify(h, bucket)
        return self.lm_head(self.norm(h))

    def decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, block_tables)
        return self.lm_head(self.norm(h))

    def bind_kv_caches(self, caches: List[torch.Tensor]) -> None:
        for layer, cache in zip(self.layers, caches):
            layer.kv_cache = cache
