"""A Llama-shaped decoder whose attention goes through the sparse backend."""

from __future__ import annotations

import torch
import torch.nn as nn

from nsa import SparseConfig
from nsa_attn.backend import SparseDecodeBackend


class SparseAttention(nn.Module):
    def __init__(self, cfg: SparseConfig, layer_id: int, backend: SparseDecodeBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.num_heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward_decode(self, hidden: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)
        out = self.backend.forward_decode(q, kv_cache[self.layer_id], self.layer_id)
        return self.o_proj(out.reshape(hidden.shape[0], -1))

    def forward_extend(self, hidden: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(hidden).view(-1, self.num_heads, self.head_dim)
        out = self.backend.forward_extend(q, kv_cache[self.layer_id])
        return self.o_proj(out.reshape(hidden.shape[0], -1))


class SparseDecoder(nn.Module):
    def __init__(self, cfg: SparseConfig, backend: SparseDecodeBackend):
        super().__init__()
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([SparseAttention(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        self.backend.refresh_sparse_indptr()
        for layer in self.layers:
            h = h + layer.forward_decode(h, kv_cache)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer.forward_extend(h, kv_cache)
        return self.lm_head(self.norm(h))
