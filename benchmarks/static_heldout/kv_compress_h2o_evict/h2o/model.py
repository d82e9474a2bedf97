"""A small Llama-style decoder whose attention layers feed the heavy-hitter statistic."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from h2o.attn.backend import H2OAttention
from h2o.policy.budget import PAGE_SIZE


class PagedKV:
    def __init__(self, num_layers: int, num_pages: int, num_kv_heads: int, head_dim: int, device: torch.device):
        self.kv = [torch.zeros((num_pages, 2, PAGE_SIZE, num_kv_heads, head_dim), dtype=torch.bfloat16, device=device) for _ in range(num_layers)]
        # running mean of the keys of every page, the summary H2O scores pages by
        self.key_means = [torch.zeros((num_pages, num_kv_heads, head_dim), dtype=torch.bfloat16, device=device) for _ in range(num_layers)]


class H2OLayer(nn.Module):
    def __init__(self, layer_id: int, hidden: int, heads: int, kv_heads: int, head_dim: int, attn: H2OAttention, kv: PagedKV):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.kv = kv
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_dim, bias=False)
        self.o = nn.Linear(heads * head_dim, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden, bias=False), nn.SiLU(), nn.Linear(4 * hidden, hidden, bias=False))
        self.ln1 = nn.RMSNorm(hidden)
        self.ln2 = nn.RMSNorm(hidden)

    def forward(self, h: torch.Tensor, slots: torch.Tensor, page_rows: torch.Tensor, bs: int, bucket: int) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(h)).split([self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1)
        q = q.view(-1, self.heads, self.head_dim)
        cache = self.kv.kv[self.layer_id]
        page, off = slots // PAGE_SIZE, slots % PAGE_SIZE
        cache[page, 0, off] = k.view(-1, self.kv_heads, self.head_dim).to(cache.dtype)
        cache[page, 1, off] = v.view(-1, self.kv_heads, self.head_dim).to(cache.dtype)
        out = self.attn.forward_decode(q, cache, bucket)
        means = self.kv.key_means[self.layer_id][page_rows].repeat_interleave(self.heads // self.kv_heads, dim=2)
        self.attn.score_pages(q, cache, means, bs)
        h = h + self.o(out.reshape(h.shape[0], -1))
        return h + self.mlp(self.ln2(h))


class H2OModel(nn.Module):
    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, attn: H2OAttention, kv: PagedKV):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([H2OLayer(i, hidden, heads, kv_heads, head_dim, attn, kv) for i in range(layers)])
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def decode(self, ids: torch.Tensor, slots: torch.Tensor, page_rows: torch.Tensor, bs: int, bucket: int) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h, slots, page_rows, bs, bucket)
        return self.lm_head(self.norm(h))
