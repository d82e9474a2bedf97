"""A Llama-shaped decoder whose KV writes index the device block table."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from pcache import PrefixCacheConfig
from pc_attn.backend import PrefixCacheBackend


class PrefixAttention(nn.Module):
    def __init__(self, cfg: PrefixCacheConfig, backend: PrefixCacheBackend) -> None:
        super().__init__()
        self.cfg, self.backend = cfg, backend
        self.q_size, self.kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(self.q_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, self.q_size, bias=False)

    def _qkv_write(self, h, positions, slots, kv_layer):
        c = self.cfg
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        rows = self.backend.block_table.block_ids.index_select(0, slots)
        blk = torch.gather(rows, 1, (positions // c.block_size).unsqueeze(1)).squeeze(1)
        off = positions % c.block_size
        kv_layer[blk, 0, off] = k.view(-1, c.num_kv_heads, c.head_dim)
        kv_layer[blk, 1, off] = v.view(-1, c.num_kv_heads, c.head_dim)
        return q.view(-1, c.num_qo_heads, c.head_dim)

    def decode(self, h, positions, slots, kv_layer):
        out = self.backend.forward_decode(self._qkv_write(h, positions, slots, kv_layer), kv_layer)
        return self.o_proj(out.reshape(-1, self.q_size))

    def extend(self, h, positions, slots, kv_layer):
        out = self.backend.forward_extend(self._qkv_write(h, positions, slots, kv_layer), kv_layer)
        return self.o_proj(out.reshape(-1, self.q_size))


class PrefixDecoder(nn.Module):
    def __init__(self, cfg: PrefixCacheConfig, backend: PrefixCacheBackend, kv_caches: List[torch.Tensor]) -> None:
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([PrefixAttention(cfg, backend) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def forward_decode(self, input_ids, positions, slots) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.decode(h, positions, slots, kv)
        return self.lm_head(h)

    def forward_mixed(self, input_ids, positions, slots) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.extend(h, positions, slots, kv)
        return self.lm_head(h)
