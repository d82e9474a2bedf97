from __future__ import annotations

import torch
from torch import nn

from llumlet.attn.backend import DecodeMeta, InstanceAttnBackend
from llumlet.config import InstanceConfig


class DecodeAttention(nn.Module):
    def __init__(self, cfg: InstanceConfig, backend: InstanceAttnBackend, softcap: bool):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.softcap = softcap
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (h + 2 * kv) * d, bias=False)
        self.o = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        cfg = self.cfg
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v = self.qkv(x).split([h * d, kv * d, kv * d], -1)
        flat = kv_cache.view(kv_cache.shape[0] * kv_cache.shape[2], 2, kv, d)
        slots = meta.slot_mapping.clamp(min=0)
        flat[:, 0].index_copy_(0, slots, k.view(-1, kv, d))
        flat[:, 1].index_copy_(0, slots, v.view(-1, kv, d))
        o = self.backend.forward_decode(q.view(-1, h, d), kv_cache, meta, self.softcap)
        return self.o(o.flatten(1))


class Block(nn.Module):
    def __init__(self, idx: int, cfg: InstanceConfig, backend: InstanceAttnBackend):
        super().__init__()
        softcap = bool(cfg.softcap_every) and idx % cfg.softcap_every == 0
        self.attn = DecodeAttention(cfg, backend, softcap)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.ffn, bias=False), nn.GELU(), nn.Linear(cfg.ffn, cfg.hidden_size, bias=False)
        )

    def forward(self, h, kv_cache, meta):
        h = h + self.attn(self.ln1(h), kv_cache, meta)
        return h + self.mlp(self.ln2(h))


class DecoderModel(nn.Module):
    def __init__(self, cfg: InstanceConfig, backend: InstanceAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([Block(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, kv_caches, meta: DecodeMeta) -> torch.Tensor:
        h = self.embed(input_ids)
        for block, kv in zip(self.blocks, kv_caches):
            h = block(h, kv, meta)
        return self.lm_head(self.norm(h))
