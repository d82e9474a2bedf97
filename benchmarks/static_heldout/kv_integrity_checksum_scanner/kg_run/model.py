from __future__ import annotations

import torch
from torch import nn

from kg_attn.backend import ScannerBackend
from kvguard import IntegrityConfig


class DecoderLayer(nn.Module):
    def __init__(self, cfg: IntegrityConfig, backend: ScannerBackend, idx: int) -> None:
        super().__init__()
        self.idx = idx
        self.backend = backend
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden)
        self.q_proj = nn.Linear(cfg.hidden, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.SiLU(), nn.Linear(4 * cfg.hidden, cfg.hidden))

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(h)).view(-1, self.heads, self.head_dim)
        h = h + self.o_proj(self.backend.decode(q, kv_cache[self.idx]).flatten(1))
        return h + self.mlp(h)


class GuardedLlama(nn.Module):
    def __init__(self, cfg: IntegrityConfig, backend: ScannerBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.layers = nn.ModuleList([DecoderLayer(cfg, backend, i) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, kv_cache)
        return self.lm_head(h)
