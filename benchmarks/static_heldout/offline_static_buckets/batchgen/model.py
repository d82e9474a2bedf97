"""A compact Llama-style decoder driven by the offline backend."""
from __future__ import annotations

from typing import List

import torch
from torch import nn
from flashinfer.norm import fused_add_rmsnorm, rmsnorm
from flashinfer.rope import apply_rope_pos_ids_inplace

from batchgen.flashinfer_backend import OfflineFlashInferBackend


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, n_q: int, n_kv: int, head_dim: int, backend: OfflineFlashInferBackend):
        super().__init__()
        self.n_q, self.n_kv, self.head_dim = n_q, n_kv, head_dim
        self.backend = backend
        self.qkv = nn.Linear(hidden, (n_q + 2 * n_kv) * head_dim, bias=False)
        self.o = nn.Linear(n_q * head_dim, hidden, bias=False)
        self.up = nn.Linear(hidden, 2 * 4 * hidden, bias=False)
        self.down = nn.Linear(4 * hidden, hidden, bias=False)
        self.ln1 = nn.Parameter(torch.ones(hidden))
        self.ln2 = nn.Parameter(torch.ones(hidden))

    def forward(self, h: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, decode: bool):
        fused_add_rmsnorm(h, residual, self.ln1, 1e-5)
        q, k, v = self.qkv(h).split([self.n_q * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], -1)
        q = q.view(-1, self.n_q, self.head_dim)
        k = k.view(-1, self.n_kv, self.head_dim)
        apply_rope_pos_ids_inplace(q, k, positions)
        if decode:
            a = self.backend.decode(q, kv_cache)
        else:
            a = self.backend.prefill(q, k, v.view(-1, self.n_kv, self.head_dim))
        h = self.o(a.reshape(h.shape[0], -1))
        fused_add_rmsnorm(h, residual, self.ln2, 1e-5)
        gate, up = self.up(h).chunk(2, -1)
        return self.down(torch.nn.functional.silu(gate) * up), residual


class OfflineLlama(nn.Module):
    def __init__(self, vocab: int, hidden: int, n_layers: int, n_q: int, n_kv: int, head_dim: int, backend: OfflineFlashInferBackend):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([DecoderLayer(hidden, n_q, n_kv, head_dim, backend) for _ in range(n_layers)])
        self.norm = nn.Parameter(torch.ones(hidden))
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv_caches: List[torch.Tensor], decode: bool) -> torch.Tensor:
        h = self.embed(ids)
        residual = torch.zeros_like(h)
        for layer, kv in zip(self.layers, kv_caches):
            h, residual = layer(h, residual, positions, kv, decode)
        fused_add_rmsnorm(h, residual, self.norm, 1e-5)
        return self.lm_head(h)
