"""Decoder whose attention goes through the shared-prefix backend."""
from __future__ import annotations

import torch
from torch import nn

from sysprompt.attn.cascade_backend import ForwardBatch, SharedPrefixBackend
from sysprompt.config import PAGE_SIZE, ServerConfig


class SysPromptLayer(nn.Module):
    def __init__(self, cfg: ServerConfig, backend: SharedPrefixBackend) -> None:
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.num_heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.backend = backend
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.kv_cache = torch.zeros(
            cfg.num_pages, 2, cfg.num_kv_heads, PAGE_SIZE, cfg.head_dim, dtype=torch.bfloat16, device=cfg.device
        )

    def forward(self, h: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.num_heads, self.head_dim)
        o = self.backend.forward_decode(q, self.kv_cache, bs)
        h = h + self.o_proj(o.flatten(1))
        return h + self.mlp(h)

    def forward_eager(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.num_heads, self.head_dim)
        o = self.backend.forward_eager(q, self.kv_cache, batch)
        h = h + self.o_proj(o.flatten(1))
        return h + self.mlp(h)


class SysPromptLM(nn.Module):
    def __init__(self, cfg: ServerConfig, backend: SharedPrefixBackend) -> None:
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([SysPromptLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, bs)
        return self.lm_head(h)

    def forward_eager(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_eager(h, batch)
        return self.lm_head(h)
