from __future__ import annotations

from typing import List

import torch
import torch.nn as nn

from longrope.attn_backend import DualRegimeBackend
from longrope.config import EngineConfig
from longrope.rope import LongRopeCache


class LongRopeAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, rope: LongRopeCache, backend: DualRegimeBackend):
        super().__init__()
        self.cfg = cfg
        self.rope = rope
        self.backend = backend
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, regime: str,
                bs: int) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        q = q.reshape(-1, c.num_qo_heads, c.head_dim)
        k = k.reshape(-1, c.num_kv_heads, c.head_dim)
        self.rope.apply(positions, q, k)
        out = self.backend.forward_decode(q, kv_cache, regime, bs)
        return h + self.o(out.reshape(h.shape))


class LongRopeModel(nn.Module):
    def __init__(self, cfg: EngineConfig, rope: LongRopeCache, backend: DualRegimeBackend):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([LongRopeAttention(cfg, rope, backend) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: List[torch.Tensor],
                regime: str, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, positions, kv, regime, bs)
        return self.lm_head(h)
