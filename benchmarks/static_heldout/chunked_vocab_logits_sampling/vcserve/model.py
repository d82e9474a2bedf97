"""A Qwen-shaped decoder body; the chunked head lives beside it and shares the embedding."""

from __future__ import annotations

import torch
from flashinfer.rope import apply_rope_pos_ids
from torch import nn

from vcserve.attention import SinkDecodeAttention
from vcserve.kv import SinkPagePool
from vocabchunk.settings import ChunkSettings


class Block(nn.Module):
    def __init__(self, s: ChunkSettings, layer_id: int, attn: SinkDecodeAttention, pool: SinkPagePool) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.pool = pool
        self.hq, self.hkv, self.d = s.num_qo_heads, s.num_kv_heads, s.head_dim
        self.ln1 = nn.RMSNorm(s.hidden_size)
        self.ln2 = nn.RMSNorm(s.hidden_size)
        self.qkv = nn.Linear(s.hidden_size, (self.hq + 2 * self.hkv) * self.d, bias=True)
        self.o = nn.Linear(self.hq * self.d, s.hidden_size, bias=False)
        self.gate_up = nn.Linear(s.hidden_size, 2 * 4 * s.hidden_size, bias=False)
        self.down = nn.Linear(4 * s.hidden_size, s.hidden_size, bias=False)

    def forward(self, h, positions, out_loc, bs: int) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(h)).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q, k = apply_rope_pos_ids(q.view(-1, self.hq, self.d), k.view(-1, self.hkv, self.d), positions)
        self.pool.write_kv(self.layer_id, k, v.view(-1, self.hkv, self.d), out_loc)
        h = h + self.o(self.attn.forward_decode(self.layer_id, q, bs).reshape(-1, self.hq * self.d))
        gate, up = self.gate_up(self.ln2(h)).chunk(2, dim=-1)
        return h + self.down(torch.nn.functional.silu(gate) * up)


class ChunkLM(nn.Module):
    def __init__(self, s: ChunkSettings, attn: SinkDecodeAttention, pool: SinkPagePool) -> None:
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size)
        self.blocks = nn.ModuleList([Block(s, i, attn, pool) for i in range(s.num_layers)])
        self.norm = nn.RMSNorm(s.hidden_size)

    def forward(self, input_ids, positions, out_loc, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.blocks:
            h = block(h, positions, out_loc, bs)
        return self.norm(h)
