"""The target model's verify forward: every tree node of every row in one pass."""

from typing import List

import torch
from torch import nn

from spec_target.verify_attn import TreeVerifyAttention
from twospec.config import SpecConfig


class VerifyLayer(nn.Module):
    def __init__(self, cfg: SpecConfig, attn: TreeVerifyAttention) -> None:
        super().__init__()
        self.attn = attn
        self.h, self.d = cfg.num_qo_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False),
            nn.SiLU(),
            nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False),
        )

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q(self.norm(x)).view(-1, self.h, self.d)
        x = x + self.o(self.attn.forward_verify(q, kv_cache, bs).reshape(x.shape[0], -1))
        return x + self.mlp(x)


class TargetLM(nn.Module):
    def __init__(self, cfg: SpecConfig, attn: TreeVerifyAttention, kv_caches: List[torch.Tensor]) -> None:
        super().__init__()
        self.kv_caches = kv_caches
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([VerifyLayer(cfg, attn) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def verify_forward(self, tokens: torch.Tensor, positions: torch.Tensor, bs: int):
        x = self.embed(tokens)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer(x, kv, bs)
        h = self.norm(x)
        return self.lm_head(h), h
