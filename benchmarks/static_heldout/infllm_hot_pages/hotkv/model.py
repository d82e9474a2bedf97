from __future__ import annotations

import torch
import torch.nn as nn

from hotkv.backend import HotPageAttnBackend


class HotAttnLayer(nn.Module):
    def __init__(self, layer_id: int, hidden: int, num_qo_heads: int, head_dim: int, backend: HotPageAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = num_qo_heads
        self.head_dim = head_dim
        self.backend = backend
        self.q_proj = nn.Linear(hidden, num_qo_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_qo_heads * head_dim, hidden, bias=False)

    def forward(self, h: torch.Tensor, hot_kv: torch.Tensor, ring_kv: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.num_qo_heads, self.head_dim)
        out = self.backend.forward_decode(q, hot_kv[self.layer_id], ring_kv[self.layer_id], bs)
        return h + self.o_proj(out.reshape(h.shape[0], -1))


class HotDecoder(nn.Module):
    def __init__(self, num_layers: int, hidden: int, vocab: int, num_qo_heads: int, head_dim: int,
                 backend: HotPageAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            [HotAttnLayer(i, hidden, num_qo_heads, head_dim, backend) for i in range(num_layers)]
        )
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, hot_kv: torch.Tensor, ring_kv: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, hot_kv, ring_kv, bs)
        return self.lm_head(h)
