"""A Llama-shaped model whose attention is whatever backend the chain picked."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from fb_backends.base import AttentionBackendBase, StepInputs
from fbchain.config import ChainConfig


class ChainAttention(nn.Module):
    def __init__(self, layer_idx: int, cfg: ChainConfig):
        super().__init__()
        self.layer_idx = layer_idx
        self.h, self.kvh, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.page_size = cfg.page_size
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def _qkv_and_store(self, x: torch.Tensor, kv: torch.Tensor, inputs: StepInputs):
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q, k, v = q.view(-1, self.h, self.d), k.view(-1, self.kvh, self.d), v.view(-1, self.kvh, self.d)
        page, off = inputs.slot_mapping // self.page_size, inputs.slot_mapping % self.page_size
        kv[page, 0, off] = k
        kv[page, 1, off] = v
        return q, k, v

    def forward(self, x, kv, inputs: StepInputs, backend: AttentionBackendBase) -> torch.Tensor:
        q, k, v = self._qkv_and_store(x, kv, inputs)
        if inputs.is_decode:
            o = backend.forward_decode(q, kv, inputs, self.layer_idx)
        else:
            o = backend.forward_prefill(q, k, v, kv, inputs, self.layer_idx)
        return self.o(o.reshape(x.shape[0], -1))

    def forward_decode(self, x, kv, inputs: StepInputs, backend: AttentionBackendBase, graph_wrapper=None):
        q, _, _ = self._qkv_and_store(x, kv, inputs)
        o = backend.forward_decode(q, kv, inputs, self.layer_idx, graph_wrapper)
        return self.o(o.reshape(x.shape[0], -1))


class Block(nn.Module):
    def __init__(self, i: int, cfg: ChainConfig):
        super().__init__()
        self.n1 = nn.RMSNorm(cfg.hidden_size)
        self.n2 = nn.RMSNorm(cfg.hidden_size)
        self.attn = ChainAttention(i, cfg)
        self.fc1 = nn.Linear(cfg.hidden_size, 2 * 3 * cfg.hidden_size, bias=False)
        self.fc2 = nn.Linear(3 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _mlp(self, h):
        g, u = self.fc1(self.n2(h)).chunk(2, dim=-1)
        return self.fc2(nn.functional.silu(g) * u)

    def forward(self, h, kv, inputs, backend):
        h = h + self.attn(self.n1(h), kv, inputs, backend)
        return h + self._mlp(h)

    def forward_decode(self, h, kv, inputs, backend, graph_wrapper=None):
        h = h + self.attn.forward_decode(self.n1(h), kv, inputs, backend, graph_wrapper)
        return h + self._mlp(h)


class ChainModel(nn.Module):
    def __init__(self, cfg: ChainConfig, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([Block(i, cfg) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def forward(self, inputs: StepInputs, backend: AttentionBackendBase) -> torch.Tensor:
        h = self.embed(inputs.input_ids)
        for blk, kv in zip(self.blocks, self.kv_caches):
            h = blk(h, kv, inputs, backend)
        return self.head(self.norm(h))

    def forward_decode(
        self, inputs: StepInputs, backend: AttentionBackendBase, graph_wrapper: Optional[object] = None
    ) -> torch.Tensor:
        h = self.embed(inputs.input_ids)
        for blk, kv in zip(self.blocks, self.kv_caches):
            h = blk.forward_decode(h, kv, inputs, backend, graph_wrapper)
        return self.head(self.norm(h))
