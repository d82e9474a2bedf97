"""Decoder with two attention paths: plain decode (graph-captured) and branch verification (eager)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from lookahead import LookaheadConfig
from la_attn.decode_backend import DecodeBackend
from la_attn.verify_backend import VerifyBackend

HIDDEN = 1024


class LookaheadLayer(nn.Module):
    def __init__(self, cfg: LookaheadConfig, decode: DecodeBackend, verify: VerifyBackend):
        super().__init__()
        self.cfg, self.decode, self.verify = cfg, decode, verify
        self.q_dim, self.kv_dim = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(HIDDEN, self.q_dim + 2 * self.kv_dim, bias=False)
        self.o_proj = nn.Linear(self.q_dim, HIDDEN, bias=False)

    def _project(self, x: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv(x).split([self.q_dim, self.kv_dim, self.kv_dim], dim=-1)
        flat = kv_cache.view(-1, 2, c.num_kv_heads, c.head_dim)
        flat[slot_mapping, 0] = k.view(-1, c.num_kv_heads, c.head_dim)
        flat[slot_mapping, 1] = v.view(-1, c.num_kv_heads, c.head_dim)
        return q.view(-1, c.num_qo_heads, c.head_dim)

    def forward_decode(self, x, kv_cache, slot_mapping, bs: Optional[int]) -> torch.Tensor:
        q = self._project(x, kv_cache, slot_mapping)
        return x + self.o_proj(self.decode.forward_decode(q, kv_cache, bs).flatten(1))

    def forward_verify(self, x, kv_cache, slot_mapping) -> torch.Tensor:
        q = self._project(x, kv_cache, slot_mapping)
        return x + self.o_proj(self.verify.verify_forward(q, kv_cache).flatten(1))


class LookaheadModel(nn.Module):
    def __init__(self, cfg: LookaheadConfig, decode: DecodeBackend, verify: VerifyBackend, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, HIDDEN)
        self.pos = nn.Embedding(cfg.max_model_len, HIDDEN)
        self.layers = nn.ModuleList([LookaheadLayer(cfg, decode, verify) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(HIDDEN, cfg.vocab_size, bias=False)
        shape = (cfg.num_pages, cfg.page_size, 2, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def decode(self, input_ids, positions, slot_mapping, bs: Optional[int]) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_decode(x, kv, slot_mapping, bs)
        return self.lm_head(x)

    def verify(self, input_ids, positions, slot_mapping) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_verify(x, kv, slot_mapping)
        return self.lm_head(x)
