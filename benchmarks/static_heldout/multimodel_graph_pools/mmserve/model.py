from __future__ import annotations

from typing import List

import torch
import torch.nn as nn

from mmserve.attn.backend import PerModelAttnBackend
from mmserve.registry import ModelSpec


class AttnLayer(nn.Module):
    def __init__(self, layer_id: int, spec: ModelSpec, backend: PerModelAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.spec = spec
        self.backend = backend
        hidden = spec.num_qo_heads * spec.head_dim
        kv = spec.num_kv_heads * spec.head_dim
        self.qkv = nn.Linear(hidden, hidden + 2 * kv, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        s = self.spec
        q, k, v = self.qkv(h).split(
            [s.num_qo_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], dim=-1
        )
        q = q.view(-1, s.num_qo_heads, s.head_dim)
        out = self.backend.forward_decode(q, kv_cache, self.layer_id, bs)
        return h + self.o(out.reshape(h.shape))


class ResidentDecoder(nn.Module):
    def __init__(self, spec: ModelSpec, backend: PerModelAttnBackend, vocab: int):
        super().__init__()
        hidden = spec.num_qo_heads * spec.head_dim
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([AttnLayer(i, spec, backend) for i in range(spec.num_layers)])
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: List[torch.Tensor],
                bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, kv, bs)
        return self.lm_head(self.norm(h))
