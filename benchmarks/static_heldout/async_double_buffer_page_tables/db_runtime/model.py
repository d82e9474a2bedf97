"""A small decoder whose attention runs through the double-buffered backend."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from db_attn.backend import DecodeContext, DoubleBufferAttnBackend
from dbuf.config import DoubleBufferConfig


class Layer(nn.Module):
    def __init__(self, cfg: DoubleBufferConfig):
        super().__init__()
        qkv = (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, qkv, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.mlp_up = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
        self.mlp_down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)


class TinyLM(nn.Module):
    def __init__(self, cfg: DoubleBufferConfig, backend: DoubleBufferAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def _q(self, layer: Layer, h: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        q = layer.qkv(layer.norm(h))[:, : c.num_qo_heads * c.head_dim]
        return q.view(-1, c.num_qo_heads, c.head_dim)

    def _mix(self, layer: Layer, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + layer.o(o.reshape(o.shape[0], -1))
        return h + layer.mlp_down(F.silu(layer.mlp_up(h)))

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
               ctx: DecodeContext) -> torch.Tensor:
        h = self.embed(ids)
        for i, layer in enumerate(self.layers):
            o = self.backend.forward_decode(self._q(layer, h), kv_cache[i], ctx)
            h = self._mix(layer, h, o)
        return self.head(h)

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                qo_indptr: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for i, layer in enumerate(self.layers):
            o = self.backend.forward_prefill(self._q(layer, h), kv_cache[i])
            h = self._mix(layer, h, o)
        last = qo_indptr[1:] - 1
        return self.head(h.index_select(0, last))
