from __future__ import annotations

from typing import List

import torch
import torch.nn as nn

from prmscore.attention import PrmAttnBackend
from prmscore.config import ScoreConfig
from prmscore.pooling import StepTagPooler


class PrmLayer(nn.Module):
    def __init__(self, cfg: ScoreConfig, attn: PrmAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        hidden = cfg.num_qo_heads * cfg.head_dim
        kv = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(hidden, hidden + 2 * kv, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        q = self.qkv(h)[:, : c.num_qo_heads * c.head_dim].reshape(-1, c.num_qo_heads, c.head_dim)
        h = h + self.o(self.attn.forward(q, kv_cache).reshape(h.shape))
        return h + self.mlp(h)


class PrmModel(nn.Module):
    def __init__(self, cfg: ScoreConfig, attn: PrmAttnBackend):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([PrmLayer(cfg, attn) for _ in range(cfg.num_layers)])
        self.pooler = StepTagPooler(cfg, attn)

    def forward(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], step_positions: torch.Tensor,
                step_counts: torch.Tensor, num_cands: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, kv)
        return self.pooler(h, step_positions, step_counts, num_cands)
