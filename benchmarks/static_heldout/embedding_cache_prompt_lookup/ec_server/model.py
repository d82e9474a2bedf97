from __future__ import annotations

import torch
from torch import nn

from ecache import ServerConfig
from ec_attn.backend import CachedPromptBackend


class Block(nn.Module):
    def __init__(self, cfg: ServerConfig, layer: int, backend: CachedPromptBackend):
        super().__init__()
        self.layer, self.backend, self.cfg = layer, backend, cfg
        h, kvh, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.sizes = [h * d, kvh * d, kvh * d]
        self.norm1, self.norm2 = nn.RMSNorm(cfg.hidden_size), nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=True)
        self.o = nn.Linear(h * d, cfg.hidden_size, bias=False)
        self.up = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(3 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _store_kv(self, x: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[0], self.cfg
        q, k, v = self.qkv(x).split(self.sizes, -1)
        cache = self.backend.kv_cache[self.layer]
        page, off = out_loc // c.page_size, out_loc % c.page_size
        cache[page, 0, off] = k.view(n, c.num_kv_heads, c.head_dim)
        cache[page, 1, off] = v.view(n, c.num_kv_heads, c.head_dim)
        return q.view(n, c.num_qo_heads, c.head_dim)

    def forward_decode(self, h: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        q = self._store_kv(self.norm1(h), out_loc)
        h = h + self.o(self.backend.forward_decode(q, self.layer, bs).flatten(1))
        return h + self.down(nn.functional.silu(self.up(self.norm2(h))))

    def forward_extend(self, h: torch.Tensor, out_loc: torch.Tensor, skip_kv: bool) -> torch.Tensor:
        x = self.norm1(h)
        if skip_kv:  # layer 0 of a cache hit already holds the copied-in KV of the cached prompt
            q = self.qkv(x).split(self.sizes, -1)[0].view(h.shape[0], -1, self.cfg.head_dim)
        else:
            q = self._store_kv(x, out_loc)
        h = h + self.o(self.backend.forward_extend(q, self.layer).flatten(1))
        return h + self.down(nn.functional.silu(self.up(self.norm2(h))))


class PromptCacheModel(nn.Module):
    def __init__(self, cfg: ServerConfig, backend: CachedPromptBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([Block(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, out_loc: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for block in self.blocks:
            h = block.forward_decode(h, out_loc, bs)
        return self.head(self.norm(h))

    def forward_extend(self, embeds: torch.Tensor, out_loc: torch.Tensor, all_cached: bool) -> torch.Tensor:
        h = embeds
        for block in self.blocks:
            h = block.forward_extend(h, out_loc, skip_kv=all_cached and block.layer == 0)
        return self.head(self.norm(h))
