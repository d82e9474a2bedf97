"""A stand-in bidirectional transformer (LLaDA-style: no causal mask anywhere)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_pos_ids

from dllm.attn import BidirBlockAttention, GraphKey
from dllm.config import DLLMConfig
from dllm.prefix_cache import PrefixKVCache


class BidirLayer(nn.Module):
    def __init__(self, cfg: DLLMConfig, layer_id: int, attn: BidirBlockAttention, cache: PrefixKVCache):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.attn = attn
        self.cache = cache
        H, KVH, D = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.split = [H * D, KVH * D, KVH * D]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.split), bias=False)
        self.o_proj = nn.Linear(H * D, cfg.hidden_size, bias=False)
        self.up = nn.Linear(cfg.hidden_size, 2 * 12288, bias=False)
        self.down = nn.Linear(12288, cfg.hidden_size, bias=False)
        self.n1 = nn.Parameter(torch.ones(cfg.hidden_size))
        self.n2 = nn.Parameter(torch.ones(cfg.hidden_size))

    def forward(
        self, h: torch.Tensor, positions: torch.Tensor, key: Optional[GraphKey], commit_loc: Optional[torch.Tensor]
    ) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv_proj(rmsnorm(h, self.n1)).split(self.split, dim=-1)
        q, k = apply_rope_pos_ids(
            q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), positions
        )
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        if commit_loc is not None:
            self.cache.write(self.layer_id, commit_loc, k, v)
        o = self.attn.forward(q, k, v, self.layer_id, key)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        gate, up = self.up(rmsnorm(h, self.n2)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class DiffusionLM(nn.Module):
    def __init__(self, cfg: DLLMConfig, attn: BidirBlockAttention, cache: PrefixKVCache):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([BidirLayer(cfg, i, attn, cache) for i in range(cfg.num_layers)])
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        key: Optional[GraphKey] = None,
        commit_loc: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, positions, key, commit_loc)
        return self.lm_head(rmsnorm(h, self.norm))
