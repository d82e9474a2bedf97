"""A stand-in Mistral decoder wired to the ring-window backend."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_pos_ids

from mistralring.attn.backend import RingWindowBackend
from mistralring.config import MistralRingConfig
from mistralring.ring_cache import RingBatch, RingKVCache


class RingAttentionLayer(nn.Module):
    def __init__(self, cfg: MistralRingConfig, layer_id: int, backend: RingWindowBackend, cache: RingKVCache):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.cache = cache
        qh, kvh, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.split = [qh * d, kvh * d, kvh * d]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.split), bias=False)
        self.o_proj = nn.Linear(qh * d, cfg.hidden_size, bias=False)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 14336, bias=False)
        self.down = nn.Linear(14336, cfg.hidden_size, bias=False)
        self.in_norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.post_norm = nn.Parameter(torch.ones(cfg.hidden_size))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv_proj(rmsnorm(h, self.in_norm)).split(self.split, dim=-1)
        q = q.view(-1, cfg.num_qo_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        q, k = apply_rope_pos_ids(q, k, positions, rope_theta=1e6)
        return q, k, v.view(-1, cfg.num_kv_heads, cfg.head_dim)

    def _kv_pool(self) -> torch.Tensor:
        if self.cfg.is_global_layer(self.layer_id):
            return self.cache.global_kv[self.layer_id]
        return self.cache.ring_kv[self.layer_id]

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(rmsnorm(h, self.post_norm)).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, batch: RingBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        if self.cfg.is_global_layer(self.layer_id):
            page, off = self.cache.global_write_slots(batch)
        else:
            page, off = self.cache.ring_write_slots(batch)
        kv = self._kv_pool()
        kv[page, 0, off] = k
        kv[page, 1, off] = v
        o = self.backend.forward_decode(q, self.layer_id, batch)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self._mlp(h)

    def prefill(self, h: torch.Tensor, positions: torch.Tensor, page: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        kv = self._kv_pool()
        kv[page, 0, off] = k
        kv[page, 1, off] = v
        o = self.backend.forward_prefill(q, self.layer_id)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self._mlp(h)


class MistralRingModel(nn.Module):
    def __init__(self, cfg: MistralRingConfig, backend: RingWindowBackend, cache: RingKVCache):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([RingAttentionLayer(cfg, i, backend, cache) for i in range(cfg.num_layers)])
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: RingBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, batch)
        return self.lm_head(rmsnorm(h, self.norm))

    def prefill(self, input_ids, positions, ring_page, ring_off, global_page, global_off) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            if self.cfg.is_global_layer(layer.layer_id):
                h = layer.prefill(h, positions, global_page, global_off)
            else:
                h = layer.prefill(h, positions, ring_page, ring_off)
        return self.lm_head(rmsnorm(h, self.norm))
