"""A llama-like model whose odd layers use a sliding window."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from radix import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, hidden: int, num_heads: int, head_dim: int, sliding_window_size: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.sliding_window_size = sliding_window_size
        self.qkv = nn.Linear(hidden, 3 * num_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)

    def _qkv(self, h: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv(h).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        kv_cache[fb.out_cache_loc, 0] = k.to(kv_cache.dtype)
        kv_cache[fb.out_cache_loc, 1] = v.to(kv_cache.dtype)
        return q

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        o = fb.attn_backend.forward_decode(self._qkv(h, kv_cache, fb), kv_cache, self)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def extend(self, h: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        o = fb.attn_backend.forward_extend(self._qkv(h, kv_cache, fb), kv_cache)
        return self.o_proj(o.reshape(h.shape[0], -1))


class RadixLlama(nn.Module):
    def __init__(self, vocab: int, hidden: int, num_layers: int, num_heads: int, head_dim: int, window: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            [RadixAttention(i, hidden, num_heads, head_dim, window if i % 2 else 0) for i in range(num_layers)]
        )
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = h + layer.decode(h, kv, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = h + layer.extend(h, kv, fb)
        return self.lm_head(self.norm(h))
