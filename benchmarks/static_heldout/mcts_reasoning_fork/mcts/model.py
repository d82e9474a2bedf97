"""Policy model with a value head; attention goes through the expansion backend."""
from __future__ import annotations

import torch
from torch import nn

from mcts.attn.expand_backend import ExpansionAttnBackend
from mcts.config import SearchConfig


class ReasonLayer(nn.Module):
    def __init__(self, cfg: SearchConfig, backend: ExpansionAttnBackend) -> None:
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.backend = backend
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))
        self.kv_cache = torch.zeros(
            cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.bfloat16, device=cfg.device
        )

    def forward(self, h: torch.Tensor, w: int) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.heads, self.head_dim)
        h = h + self.o_proj(self.backend.forward_decode(q, self.kv_cache, w).flatten(1))
        return h + self.mlp(h)


class ReasonLM(nn.Module):
    def __init__(self, cfg: SearchConfig, backend: ExpansionAttnBackend) -> None:
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.hidden_size = hidden
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([ReasonLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.norm = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, w: int):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, w)
        h = self.norm(h)
        return h, self.lm_head(h)
