"""Small decoder used by every tenant; guard tenants add a classification head."""
from __future__ import annotations

from typing import List

import torch
import torch.nn as nn
import torch.nn.functional as F

from colo.attn.tenant_backend import TenantAttnBackend
from colo.tenants import TenantKind, TenantSpec


class TenantKVCache:
    def __init__(self, spec: TenantSpec, device: torch.device):
        shape = (spec.num_pages, 2, spec.page_size, spec.num_kv_heads, spec.head_dim)
        self.page_size = spec.page_size
        self.layers: List[torch.Tensor] = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(spec.num_layers)]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        buf = self.layers[layer_id]
        buf[loc // self.page_size, 0, loc % self.page_size] = k
        buf[loc // self.page_size, 1, loc % self.page_size] = v


class TinyAttnLayer(nn.Module):
    def __init__(self, spec: TenantSpec, layer_id: int, backend: TenantAttnBackend, kv: TenantKVCache):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.kv = kv
        self.is_guard = spec.kind is TenantKind.GUARD
        self.nq, self.nkv, self.hd = spec.num_qo_heads, spec.num_kv_heads, spec.head_dim
        self.norm = nn.RMSNorm(spec.hidden_size)
        self.qkv = nn.Linear(spec.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, spec.hidden_size, bias=False)
        self.mlp_norm = nn.RMSNorm(spec.hidden_size)
        self.up = nn.Linear(spec.hidden_size, 2 * 3 * spec.hidden_size, bias=False)
        self.down = nn.Linear(3 * spec.hidden_size, spec.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, out_cache_loc: torch.Tensor) -> torch.Tensor:
        n = h.shape[0]
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(n, self.nq, self.hd)
        k = k.view(n, self.nkv, self.hd)
        v = v.view(n, self.nkv, self.hd)
        if self.is_guard:
            o = self.backend.forward_guard(q, k, v)
        else:
            self.kv.store(self.layer_id, out_cache_loc, k, v)
            o = self.backend.forward_decode(q, self.kv.layers[self.layer_id])
        h = h + self.o_proj(o.reshape(n, -1))
        gate, up = self.up(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class TinyLM(nn.Module):
    def __init__(self, spec: TenantSpec, backend: TenantAttnBackend, device: torch.device):
        super().__init__()
        self.spec = spec
        self.kv = TenantKVCache(spec, device)
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList([TinyAttnLayer(spec, i, backend, self.kv) for i in range(spec.num_layers)])
        self.norm = nn.RMSNorm(spec.hidden_size)
        out_dim = spec.num_labels if spec.kind is TenantKind.GUARD else spec.vocab_size
        self.head = nn.Linear(spec.hidden_size, out_dim, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, out_cache_loc)
        return self.head(self.norm(h))
