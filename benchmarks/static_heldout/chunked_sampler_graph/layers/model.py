"""Hybrid decoder: even layers attend a sliding window, odd layers the whole context."""

from __future__ import annotations

from typing import List

import torch

from .hybrid_attn import GROUPS, HybridAttnBackend, StepBatch


class HybridDecoder(torch.nn.Module):
    def __init__(self, vocab_size: int, hidden: int, num_layers: int, num_heads: int, head_dim: int,
                 backend: HybridAttnBackend, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.backend = backend
        self.kv_caches = kv_caches
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.embed = torch.nn.Embedding(vocab_size, hidden)
        self.q_proj = torch.nn.ModuleList([torch.nn.Linear(hidden, num_heads * head_dim) for _ in range(num_layers)])
        self.o_proj = torch.nn.ModuleList([torch.nn.Linear(num_heads * head_dim, hidden) for _ in range(num_layers)])
        self.lm_head = torch.nn.Linear(hidden, vocab_size, bias=False)
        self.layer_groups = [GROUPS.index("swa") if i % 2 == 0 else GROUPS.index("full") for i in range(num_layers)]

    def decode_forward(self, input_ids: torch.Tensor, bs: int, use_graph: bool) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, (g, kv) in enumerate(zip(self.layer_groups, self.kv_caches)):
            q = self.q_proj[layer](h).view(bs, self.num_heads, self.head_dim)
            h = h + self.o_proj[layer](self.backend.forward_decode(q, kv, g, bs, use_graph).flatten(1))
        return self.lm_head(h)

    def forward(self, input_ids: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        nd = batch.num_decodes
        h = self.embed(input_ids)
        for layer, (g, kv) in enumerate(zip(self.layer_groups, self.kv_caches)):
            q = self.q_proj[layer](h).view(-1, self.num_heads, self.head_dim)
            out = torch.empty_like(q)
            if nd:
                out[:nd] = self.backend.forward_decode(q[:nd], kv, g, nd, use_graph=False)
            if batch.num_prefills:
                out[nd:] = self.backend.forward_prefill(q[nd:], kv, g)
            h = h + self.o_proj[layer](out.flatten(1))
        return self.lm_head(h)
