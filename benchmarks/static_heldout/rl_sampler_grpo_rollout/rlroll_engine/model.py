"""The rollout copy of the policy (Qwen2-shaped), attention deferred to the rollout backend."""
from __future__ import annotations

from typing import List

import flashinfer
import torch
import torch.nn as nn

from rlroll.config import PolicyShape
from rlroll_engine.attn_backend import KV, RolloutAttnBackend, RolloutBatch


class PolicyLayer(nn.Module):
    def __init__(self, shape: PolicyShape, backend: RolloutAttnBackend):
        super().__init__()
        self.shape = shape
        self.backend = backend
        hq, hkv, d = shape.num_qo_heads, shape.num_kv_heads, shape.head_dim
        self.split = (hq * d, hkv * d, hkv * d)
        self.norm1 = nn.RMSNorm(shape.hidden_size, eps=1e-6)
        self.qkv = nn.Linear(shape.hidden_size, sum(self.split), bias=True)
        self.o_proj = nn.Linear(hq * d, shape.hidden_size, bias=False)
        self.norm2 = nn.RMSNorm(shape.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(shape.hidden_size, 18944, bias=False), nn.SiLU(), nn.Linear(18944, shape.hidden_size, bias=False))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor, kv: KV) -> torch.Tensor:
        s = self.shape
        q, k, v = self.qkv(self.norm1(h)).split(self.split, dim=-1)
        q, k = flashinfer.apply_rope_pos_ids(
            q.view(-1, s.num_qo_heads, s.head_dim), k.view(-1, s.num_kv_heads, s.head_dim), positions, rope_theta=1e6
        )
        k_cache, v_cache = kv
        k_cache.view(-1, s.num_kv_heads, s.head_dim)[out_loc] = k
        v_cache.view(-1, s.num_kv_heads, s.head_dim)[out_loc] = v.view(-1, s.num_kv_heads, s.head_dim)
        return q

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))

    def decode(self, h, positions, out_loc, kv: KV) -> torch.Tensor:
        q = self._qkv(h, positions, out_loc, kv)
        return self._finish(h, self.backend.forward_decode(q, kv))

    def prefill(self, h, fb: RolloutBatch, kv: KV) -> torch.Tensor:
        q = self._qkv(h, fb.positions, fb.out_cache_loc, kv)
        return self._finish(h, self.backend.forward_prefill(q, kv, fb))


class RolloutPolicy(nn.Module):
    def __init__(self, shape: PolicyShape, backend: RolloutAttnBackend):
        super().__init__()
        self.shape = shape
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList([PolicyLayer(shape, backend) for _ in range(shape.num_layers)])
        self.norm = nn.RMSNorm(shape.hidden_size, eps=1e-6)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.kv_caches: List[KV] = []

    def allocate_kv(self, num_pages: int, page_size: int, kv_layout: str, device: torch.device) -> None:
        s = self.shape
        if kv_layout != "NHD":
            raise ValueError(f"rollout KV writes assume NHD pages, backend uses {kv_layout}")
        for _ in range(s.num_layers):
            k = torch.zeros(num_pages, page_size, s.num_kv_heads, s.head_dim, dtype=s.dtype, device=device)
            self.kv_caches.append((k, torch.zeros_like(k)))

    def copy_page(self, src: int, dst: int) -> None:
        for k, v in self.kv_caches:
            k[dst].copy_(k[src])
            v[dst].copy_(v[src])

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, positions, out_loc, kv)
        return self.lm_head(self.norm(h))

    def prefill(self, fb: RolloutBatch) -> None:
        h = self.embed(fb.input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.prefill(h, fb, kv)
