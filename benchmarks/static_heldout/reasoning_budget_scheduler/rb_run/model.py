"""A Qwen-shaped decoder with an end-of-thinking logit bias the captured graph reads."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from reasoning.config import ReasoningConfig
from rb_attn.backend import ReasoningAttnBackend


class Attention(nn.Module):
    def __init__(self, cfg: ReasoningConfig, backend: ReasoningAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, dtype=torch.bfloat16)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False, dtype=torch.bfloat16)

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        return self.o_proj(self.backend.forward_decode(q, kv_cache).flatten(1))

    def forward_prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        return self.o_proj(self.backend.forward_prefill(q, kv_cache).flatten(1))


class ReasoningLM(nn.Module):
    def __init__(self, cfg: ReasoningConfig, backend: ReasoningAttnBackend, kv_caches: List[torch.Tensor],
                 device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=torch.bfloat16)
        self.attn = nn.ModuleList(Attention(cfg, backend) for _ in range(cfg.num_layers))
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch.bfloat16)
        self.kv_caches = kv_caches
        self.end_bias = torch.zeros(cfg.vocab_size, dtype=torch.bfloat16, device=device)
        self.end_bias[cfg.think_end_token] = 1e4

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor,
                       forced_mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for attn, kv in zip(self.attn, self.kv_caches):
            h = h + attn.forward_decode(h, kv)
        logits = self.head(h)
        return logits + forced_mask.unsqueeze(1).to(logits.dtype) * self.end_bias

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for attn, kv in zip(self.attn, self.kv_caches):
            h = h + attn.forward_prefill(h, kv)
        return self.head(h)
