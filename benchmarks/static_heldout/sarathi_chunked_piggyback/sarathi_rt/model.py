"""A Llama-shaped decoder whose attention defers to the chunked backend."""
from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn as nn
import flashinfer

from sarathi.build.batch_builder import HybridBatch
from sarathi.config import ModelShape
from sarathi_rt.attention import ChunkedAttentionBackend

KVCache = Tuple[torch.Tensor, torch.Tensor]


class PiggybackAttention(nn.Module):
    def __init__(self, shape: ModelShape, backend: ChunkedAttentionBackend, layer_id: int):
        super().__init__()
        self.shape = shape
        self.backend = backend
        self.layer_id = layer_id
        hq, hkv, d = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim
        self.split = (hq * d, hkv * d, hkv * d)
        self.qkv_proj = nn.Linear(shape.hidden_size, sum(self.split), bias=False)
        self.o_proj = nn.Linear(hq * d, shape.hidden_size, bias=False)
        self.norm = nn.RMSNorm(shape.hidden_size, eps=1e-5)

    def _project(self, h: torch.Tensor, kv_cache: KVCache, batch: HybridBatch) -> torch.Tensor:
        s = self.shape
        q, k, v = self.qkv_proj(self.norm(h)).split(self.split, dim=-1)
        q = q.view(-1, s.num_qo_heads, s.head_dim)
        k = k.view(-1, s.num_kv_heads, s.head_dim)
        v = v.view(-1, s.num_kv_heads, s.head_dim)
        q, k = flashinfer.apply_rope_pos_ids(q, k, batch.positions, rope_theta=500000.0)
        k_cache, v_cache = kv_cache
        k_cache.view(-1, s.num_kv_heads, s.head_dim).index_copy_(0, batch.slot_mapping, k)
        v_cache.view(-1, s.num_kv_heads, s.head_dim).index_copy_(0, batch.slot_mapping, v)
        return q

    def forward_decode(self, h: torch.Tensor, kv_cache: KVCache, batch: HybridBatch) -> torch.Tensor:
        q = self._project(h, kv_cache, batch)
        out = self.backend.forward_decode(q, kv_cache, batch)
        return self.o_proj(out.reshape(h.shape[0], -1))

    def forward_hybrid(self, h: torch.Tensor, kv_cache: KVCache, batch: HybridBatch) -> torch.Tensor:
        q = self._project(h, kv_cache, batch)
        out = self.backend.forward_hybrid(q, kv_cache, batch)
        return self.o_proj(out.reshape(h.shape[0], -1))


class PiggybackDecoder(nn.Module):
    def __init__(self, shape: ModelShape, backend: ChunkedAttentionBackend):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList([PiggybackAttention(shape, backend, i) for i in range(shape.num_layers)])
        self.final_norm = nn.RMSNorm(shape.hidden_size, eps=1e-5)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.kv_caches: List[KVCache] = []

    def allocate_kv(self, num_pages: int, page_size: int, device: torch.device) -> None:
        s = self.shape
        for _ in range(s.num_layers):
            k = torch.zeros(num_pages, page_size, s.num_kv_heads, s.head_dim, dtype=s.dtype, device=device)
            v = torch.zeros_like(k)
            self.kv_caches.append((k, v))

    def decode(self, input_ids: torch.Tensor, batch: HybridBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_decode(h, kv, batch)
        return self.lm_head(self.final_norm(h))

    def forward_hybrid(self, input_ids: torch.Tensor, batch: HybridBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_hybrid(h, kv, batch)
        # one row per request: the last token of a decode or of a chunk
        return self.lm_head(self.final_norm(h.index_select(0, batch.sample_rows)))
