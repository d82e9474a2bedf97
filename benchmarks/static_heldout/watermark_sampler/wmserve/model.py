from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer import apply_rope_pos_ids_inplace, rmsnorm


class Layer(nn.Module):
    def __init__(self, L, layer_id: int, attn):
        super().__init__()
        self.L = L
        self.layer_id = layer_id
        self.attn = attn
        self.qkv = nn.Linear(L.hidden_size, (L.num_qo_heads + 2 * L.num_kv_heads) * L.head_dim, bias=False)
        self.o = nn.Linear(L.num_qo_heads * L.head_dim, L.hidden_size, bias=False)
        self.gate_up = nn.Linear(L.hidden_size, 2 * 14336, bias=False)
        self.down = nn.Linear(14336, L.hidden_size, bias=False)
        self.n1 = nn.Parameter(torch.ones(L.hidden_size))
        self.n2 = nn.Parameter(torch.ones(L.hidden_size))

    def forward(self, h: torch.Tensor, positions: torch.Tensor, pre=None) -> torch.Tensor:
        L = self.L
        q, k, _ = self.qkv(rmsnorm(h, self.n1)).split(
            [L.num_qo_heads * L.head_dim, L.num_kv_heads * L.head_dim, L.num_kv_heads * L.head_dim], dim=-1)
        q = q.view(-1, L.num_qo_heads, L.head_dim)
        apply_rope_pos_ids_inplace(q, k.view(-1, L.num_kv_heads, L.head_dim), positions)
        if pre is None:
            o = self.attn.forward_decode(q, self.layer_id)
        else:
            o = self.attn.forward_prefill(q, self.layer_id, pre)
        h = h + self.o(o.flatten(1))
        g, u = self.gate_up(rmsnorm(h, self.n2)).chunk(2, dim=-1)
        return h + self.down(F.silu(g) * u)


class DecoderLM(nn.Module):
    def __init__(self, L, attn):
        super().__init__()
        self.embed = nn.Embedding(L.vocab_size, L.hidden_size)
        self.layers = nn.ModuleList([Layer(L, i, attn) for i in range(L.num_layers)])
        self.norm = nn.Parameter(torch.ones(L.hidden_size))
        self.lm_head = nn.Linear(L.hidden_size, L.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, pre=None) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, pre)
        return self.lm_head(rmsnorm(h, self.norm)).float()
