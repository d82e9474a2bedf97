"""A Llama-shaped model with three entry points: padded prefill, decode and refill (mixed) steps."""
from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn as nn
from flashinfer.rope import apply_rope_pos_ids

from bapi.config import OfflineConfig
from bapi_runtime.attention import OfflineAttention


class OfflineLayer(nn.Module):
    def __init__(self, cfg: OfflineConfig):
        super().__init__()
        self.cfg = cfg
        self.q_size, self.kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        hidden = self.q_size
        self.norm = nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden, bias=False), nn.SiLU(), nn.Linear(4 * hidden, hidden, bias=False))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.cfg
        q, k, v = self.qkv(self.norm(h)).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = apply_rope_pos_ids(q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), positions)
        return q, k, v.view(-1, c.num_kv_heads, c.head_dim)

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(o.shape[0], -1))
        return h + self.mlp(self.norm(h))

    def prefill(self, h: torch.Tensor, positions: torch.Tensor, attn: OfflineAttention, kv: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        attn.store_kv(k, v, kv)
        return self._finish(h, attn.forward_prefill(q, kv))

    def decode(self, h: torch.Tensor, positions: torch.Tensor, attn: OfflineAttention, kv: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        attn.store_kv(k, v, kv)
        return self._finish(h, attn.forward_decode(q, kv))

    def mixed(self, h: torch.Tensor, positions: torch.Tensor, n_prefill: int, attn: OfflineAttention,
              kv: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        attn.store_kv(k, v, kv)
        o = attn.forward_mixed(q[:n_prefill], k[:n_prefill], v[:n_prefill], q[n_prefill:], kv)
        return self._finish(h, o)


class OfflineLM(nn.Module):
    def __init__(self, cfg: OfflineConfig):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([OfflineLayer(cfg) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def prefill_forward(self, ids: torch.Tensor, positions: torch.Tensor, attn: OfflineAttention,
                        kv_cache: List[torch.Tensor], last_idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_cache):
            h = layer.prefill(h, positions, attn, kv)
        return self.lm_head(h.index_select(0, last_idx))

    def decode_forward(self, ids: torch.Tensor, positions: torch.Tensor, attn: OfflineAttention,
                       kv_cache: List[torch.Tensor]) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_cache):
            h = layer.decode(h, positions, attn, kv)
        return self.lm_head(h)

    def mixed_forward(self, ids: torch.Tensor, positions: torch.Tensor, n_prefill: int, attn: OfflineAttention,
                      kv_cache: List[torch.Tensor]) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_cache):
            h = layer.mixed(h, positions, n_prefill, attn, kv)
        return self.lm_head(h)
