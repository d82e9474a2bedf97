from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer import apply_rope_pos_ids_inplace, rmsnorm


class KnnDecoderLayer(nn.Module):
    def __init__(self, s, layer_id: int, attn):
        super().__init__()
        self.s = s
        self.layer_id = layer_id
        self.attn = attn
        self.qkv = nn.Linear(s.hidden_size, (s.num_qo_heads + 2 * s.num_kv_heads) * s.head_dim, bias=False)
        self.o = nn.Linear(s.num_qo_heads * s.head_dim, s.hidden_size, bias=False)
        self.fc1 = nn.Linear(s.hidden_size, 4 * s.hidden_size)
        self.fc2 = nn.Linear(4 * s.hidden_size, s.hidden_size)
        self.ln1 = nn.Parameter(torch.ones(s.hidden_size))
        self.ln2 = nn.Parameter(torch.ones(s.hidden_size))

    def forward(self, h: torch.Tensor, positions: torch.Tensor):
        s = self.s
        q, k, v = self.qkv(rmsnorm(h, self.ln1)).split(
            [s.num_qo_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], dim=-1)
        q = q.reshape(-1, s.num_qo_heads, s.head_dim)
        k = k.reshape(-1, s.num_kv_heads, s.head_dim)
        apply_rope_pos_ids_inplace(q, k, positions)
        h = h + self.o(self.attn.forward_decode(q, self.layer_id).flatten(1))
        ffn_in = rmsnorm(h, self.ln2)
        return h + self.fc2(F.gelu(self.fc1(ffn_in))), ffn_in


class KnnLM(nn.Module):
    """Returns (retrieval query, logits); the query is the last layer's FFN input refined by the key head."""

    def __init__(self, s, attn):
        super().__init__()
        self.s = s
        self.attn = attn
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList([KnnDecoderLayer(s, i, attn) for i in range(s.num_layers)])
        self.key_q = nn.Linear(s.hidden_size, (s.num_qo_heads // 4) * s.head_dim, bias=False)
        self.key_out = nn.Linear((s.num_qo_heads // 4) * s.head_dim, s.hidden_size, bias=False)
        self.norm = nn.Parameter(torch.ones(s.hidden_size))
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor):
        h = self.embed(input_ids)
        ffn_in = h
        for layer in self.layers:
            h, ffn_in = layer(h, positions)
        kq = self.key_q(ffn_in).reshape(-1, self.s.num_qo_heads // 4, self.s.head_dim)
        query = ffn_in + self.key_out(self.attn.forward_key_head(kq).flatten(1))
        return query, self.lm_head(rmsnorm(h, self.norm))
