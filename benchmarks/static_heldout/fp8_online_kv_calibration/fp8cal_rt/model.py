from __future__ import annotations

import torch
from torch import nn

from fp8cal.attn.backend import Fp8DecodeBackend
from fp8cal.calib.observer import AmaxObserver
from fp8cal.kv.cache import Fp8PagedKVCache
from fp8cal.settings import CalibSettings


class Fp8Layer(nn.Module):
    def __init__(
        self,
        s: CalibSettings,
        backend: Fp8DecodeBackend,
        cache: Fp8PagedKVCache,
        observer: AmaxObserver,
        layer_id: int,
    ):
        super().__init__()
        self.backend = backend
        self.cache = cache
        self.observer = observer
        self.layer_id = layer_id
        self.h, self.kv, self.d = s.num_qo_heads, s.num_kv_heads, s.head_dim
        self.norm = nn.RMSNorm(s.hidden_size)
        self.qkv = nn.Linear(s.hidden_size, (self.h + 2 * self.kv) * self.d, bias=False, dtype=s.dtype)
        self.o_proj = nn.Linear(self.h * self.d, s.hidden_size, bias=False, dtype=s.dtype)

    def _qkv(self, h: torch.Tensor):
        q, k, v = self.qkv(self.norm(h)).split([self.h * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        return q.view(-1, self.h, self.d), k.view(-1, self.kv, self.d), v.view(-1, self.kv, self.d)

    def _append(self, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        self.observer.record(self.layer_id, k, v)
        self.cache.append(self.layer_id, k, v, loc)

    def eager_step(self, h: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = self._qkv(h)
        self._append(k, v, self.cache.out_loc[:bs])
        o = self.backend.forward_decode_eager(self.layer_id, q, bs)
        return h + self.o_proj(o.reshape(bs, -1))

    def graph_step(self, h: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = self._qkv(h)
        self._append(k, v, self.cache.out_loc[:bs])
        o = self.backend.forward_decode_graph(self.layer_id, q, bs)
        return h + self.o_proj(o.reshape(bs, -1))

    def prompt_step(self, h: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h)
        self._append(k, v, loc)
        o = self.backend.forward_prompt(q, k, v)
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class Fp8Model(nn.Module):
    def __init__(self, s: CalibSettings, backend: Fp8DecodeBackend, cache: Fp8PagedKVCache, observer: AmaxObserver):
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.hidden_size, dtype=s.dtype)
        self.pos = nn.Embedding(s.max_context_len, s.hidden_size, dtype=s.dtype)
        self.layers = nn.ModuleList([Fp8Layer(s, backend, cache, observer, i) for i in range(s.num_layers)])
        self.norm = nn.RMSNorm(s.hidden_size)
        self.lm_head = nn.Linear(s.hidden_size, s.vocab_size, bias=False, dtype=s.dtype)

    def decode_eager(self, ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(ids) + self.pos(positions)
        for layer in self.layers:
            h = layer.eager_step(h, bs)
        return self.lm_head(self.norm(h))

    def decode_graph(self, ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(ids) + self.pos(positions)
        for layer in self.layers:
            h = layer.graph_step(h, bs)
        return self.lm_head(self.norm(h))

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.pos(positions)
        for layer in self.layers:
            h = layer.prompt_step(h, loc)
        return self.lm_head(self.norm(h))
