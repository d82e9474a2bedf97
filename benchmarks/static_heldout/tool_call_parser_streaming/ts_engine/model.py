from __future__ import annotations

from typing import List

import torch
from torch import nn

from toolstream import ServerConfig
from ts_engine.attention import ToolAttention


class ToolModelLayer(nn.Module):
    def __init__(self, cfg: ServerConfig, attn: ToolAttention) -> None:
        super().__init__()
        self.cfg, self.attn = cfg, attn
        self.q_size = cfg.num_qo_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, self.q_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.SiLU(),
                                 nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        h = h + self.o_proj(self.attn.forward_decode(q, kv_cache).reshape(-1, self.q_size))
        return h + self.mlp(h)

    def prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        h = h + self.o_proj(self.attn.forward_prefill(q, kv_cache).reshape(-1, self.q_size))
        return h + self.mlp(h)


class ToolModel(nn.Module):
    def __init__(self, cfg: ServerConfig, attn: ToolAttention, kv_caches: List[torch.Tensor]) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([ToolModelLayer(cfg, attn) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def decode(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, kv)
        return self.lm_head(h)

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.prefill(h, kv)
        return self.lm_head(h)
