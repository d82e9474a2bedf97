"""A decoder LM whose attention is the window + global + random decode of the backend."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from bbserve.attn.backend import WindowGlobalBackend
from bbserve.config import EngineConfig


class SparseAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: WindowGlobalBackend):
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.kv_cache = torch.empty(0)

    def _split(self, h: torch.Tensor):
        q, k, v = self.qkv(h).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        return q.view(-1, self.nq, self.hd), k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd)

    def decode(self, h: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        q, _, _ = self._split(h)
        o = self.backend.forward_decode(q, self.kv_cache, bs if bs is not None else -1)
        return self.o(o.reshape(h.shape[0], -1))

    def prefill(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(h)
        return self.o(self.backend.forward_prefill(q, k, v).reshape(h.shape[0], -1))


class Block(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: WindowGlobalBackend):
        super().__init__()
        self.attn = SparseAttention(cfg, layer_id, backend)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.ffn = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.SiLU(), nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def decode(self, h: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        h = h + self.attn.decode(self.ln1(h), bs)
        return h + self.ffn(self.ln2(h))

    def prefill(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn.prefill(self.ln1(h))
        return h + self.ffn(self.ln2(h))


class BigBirdLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: WindowGlobalBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        # learned position of a selected global block, pooled into the query stream
        self.block_pos_embed = nn.Embedding(cfg.max_pages_per_req, cfg.hidden_size)
        self.layers = nn.ModuleList([Block(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, input_ids: torch.Tensor, global_pos: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        h = self.embed(input_ids)
        n = input_ids.shape[0]
        h = h + self.block_pos_embed(global_pos).view(n, -1, h.shape[-1]).mean(1)
        for layer in self.layers:
            h = layer.decode(h, bs)
        return self.lm_head(self.norm(h))

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.prefill(h)
        return self.lm_head(self.norm(h))

    def bind_kv_caches(self, caches: List[torch.Tensor]) -> None:
        for layer, cache in zip(self.layers, caches):
            layer.attn.kv_cache = cache
