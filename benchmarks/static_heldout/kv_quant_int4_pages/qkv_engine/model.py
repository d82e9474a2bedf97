"""Decoder whose attention goes through the quantized-KV decode attention."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from qkv.config import QuantKVConfig
from qkv_engine.attention import QuantDecodeAttention


class QuantAttentionBlock(nn.Module):
    def __init__(self, cfg: QuantKVConfig, layer_id: int, attn: QuantDecodeAttention):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm = nn.LayerNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=True)
        self.o_proj = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(bs, self.nq, self.hd)
        self.attn.append_kv(self.layer_id, k.view(bs, self.nkv, self.hd), v.view(bs, self.nkv, self.hd), bs)
        o = self.attn.decode_layer(self.layer_id, q, bs)
        h = h + self.o_proj(o.reshape(bs, -1))
        gate, up = self.gate_up(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class QuantLM(nn.Module):
    def __init__(self, cfg: QuantKVConfig, attn: QuantDecodeAttention):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([QuantAttentionBlock(cfg, i, attn) for i in range(cfg.num_layers)])
        self.norm = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, bs)
        return self.lm_head(self.norm(h))
