from __future__ import annotations

import torch
from torch import nn

from sgl_pw.layers.radix_attention import RadixAttention


class TinyDecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.qkv = nn.Linear(h, (self.num_heads + 2 * self.num_kv_heads) * d, bias=False)
        self.o = nn.Linear(self.num_heads * d, h, bias=False)
        self.attn = RadixAttention(self.num_heads, d, d**-0.5, self.num_kv_heads, layer_id)

    def forward(self, positions, hidden_states, forward_batch):
        d = self.attn.head_dim
        q, k, v = self.qkv(hidden_states).split([self.num_heads * d, self.num_kv_heads * d, self.num_kv_heads * d], -1)
        return hidden_states + self.o(self.attn.forward(q, k, v, forward_batch))


class TinyForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([TinyDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids, positions, forward_batch):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward(positions, h, forward_batch)
        return self.lm_head(h)
