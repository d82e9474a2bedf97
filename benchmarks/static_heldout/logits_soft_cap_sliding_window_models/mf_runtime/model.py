"""Decoder stacks of the families; attention goes through the shared FamilyBackend."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from mfserve import FamilySpec, ServeConfig
from mf_attn.backend import FamilyBackend

HIDDEN = 2048


class FamilyAttention(nn.Module):
    def __init__(self, spec: FamilySpec, layer_idx: int, backend: FamilyBackend):
        super().__init__()
        self.spec, self.layer_idx, self.backend = spec, layer_idx, backend
        self.q_proj = nn.Linear(HIDDEN, spec.num_qo_heads * spec.head_dim, bias=False)
        self.o_proj = nn.Linear(spec.num_qo_heads * spec.head_dim, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        q = self.q_proj(x).view(-1, self.spec.num_qo_heads, self.spec.head_dim)
        o = self.backend.attend(self.spec.name, self.layer_idx, q, kv_cache, bs)
        return self.o_proj(o.flatten(1))


class FamilyModel(nn.Module):
    def __init__(self, spec: FamilySpec, backend: FamilyBackend, cfg: ServeConfig, device: torch.device):
        super().__init__()
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, HIDDEN)
        self.pos_embed = nn.Embedding(cfg.max_model_len, HIDDEN)
        self.layers = nn.ModuleList([FamilyAttention(spec, i, backend) for i in range(spec.num_layers)])
        self.lm_head = nn.Linear(HIDDEN, spec.vocab_size, bias=False)
        shape = (cfg.num_pages, 2, cfg.page_size, spec.num_kv_heads, spec.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(spec.num_layers)]
        # the tokenizer's vocabulary is smaller than the padded embedding table
        self.vocab_mask = torch.ones(spec.vocab_size, dtype=torch.bool, device=device)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos_embed(positions)
        for attn, kv in zip(self.layers, self.kv_caches):
            x = x + attn(x, kv, bs)
        return self.compute_logits(x)

    def compute_logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(x).float()
        cap = self.spec.final_soft_cap
        if cap is not None:
            logits = cap * torch.tanh(logits / cap)
        logits = torch.where(self.vocab_mask, logits, torch.finfo(logits.dtype).min)  # ok: FC101
        if torch.isinf(logits).any():  # expect: FC101
            logits = torch.nan_to_num(logits)
        return logits
