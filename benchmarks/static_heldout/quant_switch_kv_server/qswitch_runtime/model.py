"""A Qwen-shaped decoder whose attention goes through QuantAttention."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from qswitch.config import SwitchConfig
from qswitch.dtypes import KVClass
from qswitch.pool import QuantKVPool
from qswitch_backends.registry import QuantAttention


class QuantLayer(nn.Module):
    def __init__(self, cfg: SwitchConfig, layer_id: int, pool: QuantKVPool, attn: QuantAttention):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.pool = pool
        self.attn = attn
        q, kv = cfg.num_q_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.splits = (q, kv, kv)
        self.qkv = nn.Linear(cfg.hidden_size, q + 2 * kv, bias=True)
        self.o = nn.Linear(q, cfg.hidden_size, bias=False)
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.mlp_in = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
        self.mlp_out = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _store(self, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        kv = self.pool.layer(self.attn.active, self.layer_id)
        page, off = out_loc // self.cfg.page_size, out_loc % self.cfg.page_size
        if self.attn.active is KVClass.FP8:
            scale = self.attn.fp8.k_scale[self.layer_id]
            k, v = (k / scale).to(kv), (v / self.attn.fp8.v_scale[self.layer_id]).to(kv)
        kv[page, 0, :, off] = k
        kv[page, 1, :, off] = v

    def forward(self, h: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv(self.norm1(h)).split(self.splits, dim=-1)
        self._store(k.view(-1, c.num_kv_heads, c.head_dim), v.view(-1, c.num_kv_heads, c.head_dim), out_loc)
        o = self.attn.forward_decode(q.view(-1, c.num_q_heads, c.head_dim), self.layer_id, bs)
        h = h + self.o(o.flatten(1))
        a, b = self.mlp_in(self.norm2(h)).chunk(2, dim=-1)
        return h + self.mlp_out(F.silu(a) * b)


class QuantLM(nn.Module):
    def __init__(self, cfg: SwitchConfig, pool: QuantKVPool, attn: QuantAttention):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([QuantLayer(cfg, i, pool, attn) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, out_loc, bs)
        return self.lm_head(self.norm(h))
