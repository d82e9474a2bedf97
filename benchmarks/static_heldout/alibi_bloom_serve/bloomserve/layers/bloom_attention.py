from __future__ import annotations

import math

import torch
import torch.nn as nn

from bloomserve.forward_batch import ForwardBatch


class BloomAttention(nn.Module):
    def __init__(self, cfg, tp_size: int, layer_id: int, attn_backend):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = cfg.num_heads // tp_size
        self.head_dim = cfg.head_dim
        self.attn_backend = attn_backend
        self._sm_scale = 1.0 / math.sqrt(self.head_dim)
        self.query_key_value = nn.Linear(cfg.hidden_size, 3 * self.num_heads * self.head_dim)
        self.dense = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size)

    def forward(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        qkv = self.query_key_value(h).view(-1, self.num_heads, 3, self.head_dim)
        q, k, v = qkv.unbind(2)
        self.attn_backend.save_kv(k, v, fb.out_cache_loc, self.layer_id)
        if fb.forward_mode.is_decode():
            o = self.attn_backend.forward_decode(q, self.layer_id, fb)
        else:
            o = self.attn_backend.forward_extend(q, k, v, self.layer_id, fb)
        return self.dense(o.reshape(h.shape[0], -1))


class BloomBlock(nn.Module):
    def __init__(self, cfg, tp_size: int, layer_id: int, attn_backend):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.self_attention = BloomAttention(cfg, tp_size, layer_id, attn_backend)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def forward(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.self_attention(self.input_layernorm(h), fb)
        return h + self.mlp(self.post_attention_layernorm(h))
