from __future__ import annotations

import torch
from torch import nn

from jm_attn.backend import JsonBackend
from jsonmode import JsonModeConfig


class Block(nn.Module):
    def __init__(self, cfg: JsonModeConfig, backend: JsonBackend, idx: int) -> None:
        super().__init__()
        self.idx = idx
        self.backend = backend
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden)
        self.q_proj = nn.Linear(cfg.hidden, cfg.num_qo_heads * cfg.head_dim)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.SiLU(), nn.Linear(4 * cfg.hidden, cfg.hidden))

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(h)).view(-1, self.heads, self.head_dim)
        h = h + self.o_proj(self.backend.forward_decode(q, kv_cache[self.idx]).flatten(1))
        return h + self.mlp(h)


class QwenJson(nn.Module):
    def __init__(self, cfg: JsonModeConfig, backend: JsonBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList([Block(cfg, backend, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.blocks:
            h = block(h, kv_cache)
        return self.lm_head(self.norm(h))
