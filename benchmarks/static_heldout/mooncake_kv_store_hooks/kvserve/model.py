"""Llama-shaped decoder over ``StoreAwareFlashInferBackend``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvserve.attention import StoreAwareFlashInferBackend
from kvserve.metadata import DecodeMetadata, PrefillMetadata
from kvstore import StoreConfig


class Layer(nn.Module):
    def __init__(self, layer_id: int, cfg: StoreConfig, backend: StoreAwareFlashInferBackend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.nq, self.nkv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.d, bias=False)
        self.o = nn.Linear(self.nq * self.d, cfg.hidden_size, bias=False)
        self.gate_up = nn.Linear(cfg.hidden_size, 8 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _q(self, x: torch.Tensor, out_cache_loc: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).split([self.nq * self.d, self.nkv * self.d, self.nkv * self.d], dim=-1)
        self.backend.store_kv(self.layer_id, k.view(-1, self.nkv, self.d), v.view(-1, self.nkv, self.d), out_cache_loc)
        return q.view(-1, self.nq, self.d)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(self.ln2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)

    def decode(self, x: torch.Tensor, meta: DecodeMetadata, out_cache_loc: torch.Tensor) -> torch.Tensor:
        o = self.backend.decode_attention(self._q(x, out_cache_loc), self.layer_id, meta)
        return self._mlp(x + self.o(o.flatten(1)))

    def prefill(self, x: torch.Tensor, meta: PrefillMetadata) -> torch.Tensor:
        o = self.backend.prefill_attention(self._q(x, meta.out_cache_loc), self.layer_id)
        return self._mlp(x + self.o(o.flatten(1)))


class StoreLM(nn.Module):
    def __init__(self, cfg: StoreConfig, backend: StoreAwareFlashInferBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(
        self, input_ids: torch.Tensor, out_cache_loc: torch.Tensor, meta: DecodeMetadata
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, meta, out_cache_loc)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, meta: PrefillMetadata) -> torch.Tensor:
        h = self.embed(meta.input_ids)
        for layer in self.layers:
            h = layer.prefill(h, meta)
        return self.lm_head(self.norm(h.index_select(0, meta.last_token_rows)))
