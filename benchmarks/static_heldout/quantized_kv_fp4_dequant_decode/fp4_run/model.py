"""A small decoder whose attention reads the FP4 KV cache through the dequant backend."""

import torch
from torch import nn

from fp4_attn.backend import FP4DequantBackend
from fp4kv import FP4Config


class FP4Attention(nn.Module):
    def __init__(self, layer_id: int, cfg: FP4Config, backend: FP4DequantBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.h_q = cfg.num_qo_heads
        self.h_kv = cfg.num_kv_heads
        self.d = cfg.head_dim
        hidden = self.h_q * self.d
        self.qkv = nn.Linear(hidden, (self.h_q + 2 * self.h_kv) * self.d, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def _split(self, h: torch.Tensor):
        qkv = self.qkv(h)
        q, k, v = qkv.split([self.h_q * self.d, self.h_kv * self.d, self.h_kv * self.d], dim=-1)
        return q.view(-1, self.h_q, self.d), k.view(-1, self.h_kv, self.d), v.view(-1, self.h_kv, self.d)

    def forward(self, h: torch.Tensor, out_loc: torch.Tensor, scales: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = self._split(h)
        self.backend.write_kv(self.layer_id, k, v, out_loc, scales)
        o = self.backend.forward_decode(self.layer_id, q, bs)
        return self.o_proj(o.reshape(h.shape[0], -1))


class FP4DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: FP4Config, backend: FP4DequantBackend):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.attn = FP4Attention(layer_id, cfg, backend)
        self.norm1 = nn.RMSNorm(hidden)
        self.norm2 = nn.RMSNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden, bias=False), nn.SiLU(),
                                 nn.Linear(4 * hidden, hidden, bias=False))

    def forward(self, h, out_loc, scales, bs: int):
        h = h + self.attn(self.norm1(h), out_loc, scales, bs)
        return h + self.mlp(self.norm2(h))


class FP4Decoder(nn.Module):
    def __init__(self, cfg: FP4Config, backend: FP4DequantBackend, vocab: int = 32000):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([FP4DecoderLayer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, out_loc: torch.Tensor, scales: torch.Tensor, bs: int):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, out_loc, scales, bs)
        return self.lm_head(self.norm(h))
