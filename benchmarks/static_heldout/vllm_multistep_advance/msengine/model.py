"""A Mistral-like decoder (sliding-window layers every other layer) over the FlashInfer impl."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from msengine.attention.flashinfer_backend import FlashInferImpl, FlashInferMetadata


class Attention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, sliding_window: Optional[int]):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.qkv = nn.Linear(hidden, (num_heads + 2 * num_kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.impl = FlashInferImpl(num_heads, head_dim, head_dim**-0.5, sliding_window)

    def _qkv(self, h, kv_cache, md: FlashInferMetadata):
        q, k, v = self.qkv(h).split(
            [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim], -1
        )
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
            kv_cache[:, 0],
            kv_cache[:, 1],
            md.slot_mapping,
            "auto",
        )
        return q.view(-1, self.num_heads, self.head_dim)

    def forward(self, h, kv_cache, md: FlashInferMetadata):
        q = self._qkv(h, kv_cache, md)
        n_pre = md.num_prefill_tokens
        out = torch.empty_like(q)
        if md.num_prefills:
            out[:n_pre] = self.impl.forward_prefill(q[:n_pre], kv_cache, md)
        if md.num_decode_tokens:
            out[n_pre:] = self.impl.forward_decode(q[n_pre:], kv_cache, md)
        return self.o(out.flatten(1))

    def decode(self, h, kv_cache, md: FlashInferMetadata):
        q = self._qkv(h, kv_cache, md)
        return self.o(self.impl.forward_decode(q, kv_cache, md).flatten(1))


class Layer(nn.Module):
    def __init__(self, idx: int, cfg):
        super().__init__()
        window = cfg.sliding_window if idx % 2 == 1 else None
        self.attn = Attention(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, window)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, cfg.ffn, bias=False), nn.SiLU(), nn.Linear(cfg.ffn, cfg.hidden_size, bias=False))

    def forward(self, h, kv_cache, md):
        h = h + self.attn(self.ln1(h), kv_cache, md)
        return h + self.mlp(self.ln2(h))

    def decode(self, h, kv_cache, md):
        h = h + self.attn.decode(self.ln1(h), kv_cache, md)
        return h + self.mlp(self.ln2(h))


class MistralLike(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(i, cfg) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, positions, kv_caches, md: FlashInferMetadata):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, kv, md)
        return self.norm(h)

    def decode(self, input_ids, positions, kv_caches, md: FlashInferMetadata):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.decode(h, kv, md)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
