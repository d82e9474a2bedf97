"""One set of weights, two attention objects: the prefill side and the decode side."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from colo import EngineConfig
from colo_attn.decode_attn import DecodeAttention
from colo_attn.prefill_attn import PrefillAttention


class ColoLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, prefill_attn: PrefillAttention, decode_attn: DecodeAttention):
        super().__init__()
        self.prefill_attn = prefill_attn
        self.decode_attn = decode_attn
        self.h, self.d = cfg.num_qo_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.RMSNorm(cfg.hidden_size),
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def prefill(self, x: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(x)).view(-1, self.h, self.d)
        x = x + self.o_proj(self.prefill_attn.forward(q, kv_cache).reshape(x.shape[0], -1))
        return x + self.mlp(x)

    def decode(self, x: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q_proj(self.norm(x)).view(-1, self.h, self.d)
        x = x + self.o_proj(self.decode_attn.forward(q, kv_cache, bs).reshape(x.shape[0], -1))
        return x + self.mlp(x)


class ColoModel(nn.Module):
    def __init__(self, cfg: EngineConfig, prefill_attn: PrefillAttention, decode_attn: DecodeAttention):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([ColoLayer(cfg, prefill_attn, decode_attn) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_prefill(
        self, input_ids: torch.Tensor, last_idx: torch.Tensor, kv_caches: List[torch.Tensor]
    ) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer.prefill(x, kv)
        return self.lm_head(self.norm(x[last_idx])).argmax(dim=-1)

    def forward_decode(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], bs: int) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            x = layer.decode(x, kv, bs)
        return self.lm_head(self.norm(x))
