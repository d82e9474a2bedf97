"""A small decoder whose attention goes through the decode backend."""

from __future__ import annotations

import torch
import torch.nn as nn

from sampling import ModelConfig
from sp_graphs.attn import DecodeBackend


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, backend: DecodeBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.heads, self.head_dim = cfg.num_qo_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(h)).view(-1, self.heads, self.head_dim)
        out = self.backend.forward_decode(q, kv_cache[self.layer_id])
        return h + self.o_proj(out.reshape(h.shape[0], -1))

    def forward_prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(h)).view(-1, self.heads, self.head_dim)
        out = self.backend.forward_prefill(q, kv_cache[self.layer_id])
        return h + self.o_proj(out.reshape(h.shape[0], -1))


class TinyLM(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: DecodeBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([Block(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for blk in self.blocks:
            h = blk.forward_decode(h, kv_cache)
        return self.lm_head(self.norm(h)).float()

    def forward_prefill(self, input_ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for blk in self.blocks:
            h = blk.forward_prefill(h, kv_cache)
        return self.lm_head(self.norm(h)).float()
