"""Decoder whose attention goes through the reservation backend (graph decode or eager overflow)."""

from __future__ import annotations

import torch
from torch import nn

from prio.limits import PoolLimits
from prio_srv.attn_backend import ReservationAttnBackend
from prio_srv.batch import DecodeBatch


class PrioDecoderLayer(nn.Module):
    def __init__(self, lim: PoolLimits, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.nq, self.nkv, self.hd = lim.num_qo_heads, lim.num_kv_heads, lim.head_dim
        self.norm = nn.RMSNorm(lim.hidden_size)
        self.qkv = nn.Linear(lim.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, lim.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(lim.hidden_size, 4 * lim.hidden_size), nn.SiLU(),
                                 nn.Linear(4 * lim.hidden_size, lim.hidden_size))

    def _qkv(self, h: torch.Tensor):
        q, k, v = self.qkv(self.norm(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        return q.view(-1, self.nq, self.hd), k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd)

    def decode(self, h: torch.Tensor, batch: DecodeBatch, backend: ReservationAttnBackend) -> torch.Tensor:
        q, k, v = self._qkv(h)
        h = h + self.o(backend.forward_decode(q, k, v, self.layer_id, batch).flatten(1))
        return h + self.mlp(h)

    def decode_eager(self, h: torch.Tensor, batch: DecodeBatch, backend: ReservationAttnBackend) -> torch.Tensor:
        q, k, v = self._qkv(h)
        h = h + self.o(backend.forward_decode_eager(q, k, v, self.layer_id, batch).flatten(1))
        return h + self.mlp(h)


class PrioLM(nn.Module):
    def __init__(self, lim: PoolLimits, backend: ReservationAttnBackend):
        super().__init__()
        self.backend = backend
        self.embed = nn.Embedding(lim.vocab_size, lim.hidden_size)
        self.layers = nn.ModuleList([PrioDecoderLayer(lim, i) for i in range(lim.num_layers)])
        self.head = nn.Linear(lim.hidden_size, lim.vocab_size, bias=False)

    def decode_graph(self, input_ids: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, batch, self.backend)
        return self.head(h)

    def decode_eager(self, input_ids: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode_eager(h, batch, self.backend)
        return self.head(h)
