"""A decoder with interleaved local (sliding-window) and global attention layers."""
from __future__ import annotations

from typing import List

import torch
from torch import nn
from flashinfer import single_prefill_with_kv_cache
from flashinfer.norm import rmsnorm

from desklm.buckets import LengthBuckets
from desklm.kv.paged_cache import SingleSeqKVCache
from desklm.settings import DeskSettings


class Attention(nn.Module):
    def __init__(self, s: DeskSettings, layer_id: int, buckets: LengthBuckets, kv: SingleSeqKVCache):
        super().__init__()
        self.s = s
        self.layer_id = layer_id
        self.local = s.is_local(layer_id)
        self.buckets = buckets
        self.kv = kv
        self.qkv = nn.Linear(s.hidden_size, (s.num_qo_heads + 2 * s.num_kv_heads) * s.head_dim, bias=False)
        self.o = nn.Linear(s.num_qo_heads * s.head_dim, s.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, prefill: bool) -> torch.Tensor:
        s = self.s
        q, k, v = self.qkv(h).split([s.num_qo_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], -1)
        q = q.view(-1, s.num_qo_heads, s.head_dim)
        k = k.view(-1, s.num_kv_heads, s.head_dim)
        v = v.view(-1, s.num_kv_heads, s.head_dim)
        b = self.buckets
        self.kv.append(self.layer_id, k, v, positions, b.kv_indptr, b.last_page_len)
        cache = self.kv.caches[self.layer_id]
        if prefill:
            window = s.local_window if self.local else -1
            out = single_prefill_with_kv_cache(q, k, v, causal=True, window_left=window)
        elif self.local:
            out = b.attend_local(q, cache)
        else:
            out = b.attend_global(q, cache)
        return self.o(out.reshape(h.shape[0], -1))


class DeskModel(nn.Module):
    def __init__(self, s: DeskSettings, buckets: LengthBuckets, kv: SingleSeqKVCache):
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.attn = nn.ModuleList([Attention(s, i, buckets, kv) for i in range(s.num_layers)])
        self.mlp = nn.ModuleList([nn.Sequential(nn.Linear(s.hidden_size, 8192), nn.GELU(), nn.Linear(8192, s.hidden_size)) for _ in range(s.num_layers)])
        self.norms = nn.Parameter(torch.ones(s.num_layers * 2 + 1, s.hidden_size))
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, prefill: bool) -> torch.Tensor:
        h = self.embed(ids)
        for i, (attn, mlp) in enumerate(zip(self.attn, self.mlp)):
            h = h + attn(rmsnorm(h, self.norms[2 * i], 1e-6), positions, prefill)
            h = h + mlp(rmsnorm(h, self.norms[2 * i + 1], 1e-6))
        return self.lm_head(rmsnorm(h[-1:], self.norms[-1], 1e-6))
