"""Llama with a blended-prefill forward: layer 0 over every prompt token, later layers over the
selected tokens only."""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from blendserve.attn.backend import BlendFlashInferBackend
from blendserve.batch import ForwardBatch
from blendserve.blend.cow import BlendCoW
from blendserve.blend.selector import HKVDSelector, SelectedTokens


class BlendAttention(nn.Module):
    def __init__(self, cfg, backend: BlendFlashInferBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (h + 2 * kv) * d, bias=False)
        self.o = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.register_buffer("dummy_slot", torch.zeros((), dtype=torch.int64), persistent=False)

    def _split(self, x):
        cfg = self.cfg
        h, kv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v = self.qkv(x).split([h * d, kv * d, kv * d], -1)
        return q.view(-1, h, d), k.view(-1, kv, d), v.view(-1, kv, d)

    @staticmethod
    def _store(kv_cache, k, v, slots):
        flat = kv_cache.view(2, -1, *kv_cache.shape[-2:])
        flat[0].index_copy_(0, slots, k)
        flat[1].index_copy_(0, slots, v)

    def forward_full(self, x, kv_cache, fb: ForwardBatch):
        q, k, v = self._split(x)
        self._store(kv_cache, k, v, fb.out_cache_loc)
        o = self.backend.forward_ragged(q, k, v)
        return self.o(o.flatten(1)), k

    def forward_selected(self, x_sel, kv_cache, sel: SelectedTokens, slots: torch.Tensor):
        q, k, v = self._split(x_sel)
        self._store(kv_cache, k, v, slots)
        return self.o(self.backend.forward_blend(q, kv_cache).flatten(1))

    def forward_decode(self, x, kv_cache, fb: ForwardBatch):
        q, k, v = self._split(x)
        # padded rows of a captured batch write to a dummy slot
        slots = torch.where(fb.out_cache_loc >= 0, fb.out_cache_loc, self.dummy_slot)  # ok: FC101
        self._store(kv_cache, k, v, slots)
        return self.o(self.backend.forward_decode(q, kv_cache, fb).flatten(1))


class BlendLayer(nn.Module):
    def __init__(self, cfg, backend):
        super().__init__()
        self.attn = BlendAttention(cfg, backend)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, cfg.ffn, bias=False), nn.SiLU(), nn.Linear(cfg.ffn, cfg.hidden_size, bias=False)
        )

    def forward_full(self, h, kv, fb):
        a, k = self.attn.forward_full(self.ln1(h), kv, fb)
        h = h + a
        return h + self.mlp(self.ln2(h)), k

    def forward_selected(self, h, kv, sel, slots):
        h = h + self.attn.forward_selected(self.ln1(h), kv, sel, slots)
        return h + self.mlp(self.ln2(h))

    def forward_decode(self, h, kv, fb):
        h = h + self.attn.forward_decode(self.ln1(h), kv, fb)
        return h + self.mlp(self.ln2(h))


class BlendLlama(nn.Module):
    def __init__(self, cfg, backend: BlendFlashInferBackend, cow: BlendCoW):
        super().__init__()
        self.backend = backend
        self.cow = cow
        self.selector = HKVDSelector(cfg.recompute_ratio, cfg.device)
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([BlendLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.kv_caches: list = []

    def forward_blend(self, fb: ForwardBatch, query_lens: np.ndarray) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        h, k0 = self.layers[0].forward_full(h, self.kv_caches[0], fb)
        sel = self.selector.select(k0, fb, query_lens)
        slots = self.cow.privatize(fb, sel)
        self.backend.plan_selected(fb, sel)
        h = h[sel.token_idx]
        for layer, kv in zip(self.layers[1:], self.kv_caches[1:]):
            h = layer.forward_selected(h, kv, sel, slots)
        return self.norm(h)

    def forward_extend(self, fb: ForwardBatch) -> torch.Tensor:
        # a prompt without reused chunks: every layer over every token
        h = self.embed(fb.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h, _ = layer.forward_full(h, kv, fb)
        return self.norm(h)

    def forward_decode(self, input_ids, positions, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_decode(h, kv, fb)
        return self.norm(h)
