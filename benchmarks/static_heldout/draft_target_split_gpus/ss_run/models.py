from __future__ import annotations

import torch
from torch import nn

from splitspec import SplitConfig
from ss_attn.attention import DeviceAttention


class SpecLayer(nn.Module):
    def __init__(self, hidden: int, cfg: SplitConfig, attn: DeviceAttention, idx: int) -> None:
        super().__init__()
        self.idx = idx
        self.attn = attn
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(hidden, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 3 * hidden), nn.SiLU(), nn.Linear(3 * hidden, hidden))

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.heads, self.head_dim)
        h = h + self.o_proj(self.attn.forward(q, kv_cache[self.idx]).flatten(1))
        return h + self.mlp(h)


class SpecLM(nn.Module):
    def __init__(self, num_layers: int, hidden: int, cfg: SplitConfig, attn: DeviceAttention) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([SpecLayer(hidden, cfg, attn, i) for i in range(num_layers)])
        self.head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = layer(h, kv_cache)
        return self.head(h)
