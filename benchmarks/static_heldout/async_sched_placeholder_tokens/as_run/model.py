"""A small decoder whose attention layers call the backend for decode or prefill."""
from typing import List

import torch
from torch import nn

from as_attn.backend import AsyncFlashInferBackend
from as_attn.metadata import StepMetadata
from asched import AsyncSchedConfig


class AttnLayer(nn.Module):
    def __init__(self, cfg: AsyncSchedConfig, backend: AsyncFlashInferBackend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        self.qkv = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def _split(self, h: torch.Tensor):
        c = self.cfg
        q, k, v = self.qkv(h).split([c.num_qo_heads * c.head_dim] + [c.num_kv_heads * c.head_dim] * 2, dim=-1)
        return q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), v.view(-1, c.num_kv_heads, c.head_dim)

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int, meta: StepMetadata) -> torch.Tensor:
        q, k, v = self._split(h)
        self.backend.write_kv(k, v, kv_cache, meta)
        return h + self.o(self.backend.forward_decode(q, kv_cache, bs, meta).flatten(1))

    def prefill(self, h: torch.Tensor, kv_cache: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        q, k, v = self._split(h)
        self.backend.write_kv(k, v, kv_cache, meta)
        return h + self.o(self.backend.forward_prefill(q, kv_cache).flatten(1))


class TinyDecoder(nn.Module):
    def __init__(self, cfg: AsyncSchedConfig, backend: AsyncFlashInferBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AttnLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids, positions, kv_caches: List[torch.Tensor], bs: int, meta: StepMetadata):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.decode(h, kv, bs, meta)
        return self.norm(h)

    def forward_prefill(self, input_ids, positions, kv_caches: List[torch.Tensor], meta: StepMetadata):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.prefill(h, kv, meta)
        return self.norm(h)
