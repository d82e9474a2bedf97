"""Target model verifying a token tree in one pass, plus a one-layer draft head proposing the next tree."""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from sdt import SpecConfig
from sdt_attn.tree_backend import Key, TreeAttnBackend

KVCache = Tuple[torch.Tensor, torch.Tensor]  # NHD: [num_pages, page_size, kv_heads, head_dim] each


def store_kv(cache: KVCache, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    k_cache, v_cache = cache
    k_cache.view(-1, *k_cache.shape[2:])[loc] = k
    v_cache.view(-1, *v_cache.shape[2:])[loc] = v


class Attention(nn.Module):
    def __init__(self, cfg: SpecConfig, backend: TreeAttnBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.q_size, self.kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False, device=device, dtype=cfg.dtype)
        self.o = nn.Linear(self.q_size, cfg.hidden_size, bias=False, device=device, dtype=cfg.dtype)

    def project(self, h: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        kv_shape = (-1, cfg.num_kv_heads, cfg.head_dim)
        return q.view(-1, cfg.num_heads, cfg.head_dim), k.view(kv_shape), v.view(kv_shape)

    def forward(self, h: torch.Tensor, cache: KVCache, loc: torch.Tensor, key: Optional[Key]) -> torch.Tensor:
        q, k, v = self.project(h)
        store_kv(cache, loc, k, v)
        return self.o(self.backend.forward_tree(q, cache, key).reshape(h.shape[0], -1))


class Block(nn.Module):
    def __init__(self, cfg: SpecConfig, backend: TreeAttnBackend, device: torch.device):
        super().__init__()
        self.norm1 = nn.RMSNorm(cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.attn = Attention(cfg, backend, device)
        self.norm2 = nn.RMSNorm(cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.up = nn.Linear(cfg.hidden_size, 8 * cfg.hidden_size, bias=False, device=device, dtype=cfg.dtype)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False, device=device, dtype=cfg.dtype)

    def forward(self, h, cache: KVCache, loc, key: Optional[Key]) -> torch.Tensor:
        h = h + self.attn(self.norm1(h), cache, loc, key)
        gate, up = self.up(self.norm2(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class DraftHead(nn.Module):
    """EAGLE-style head: one attention layer over the target's hidden states, decoding the next root."""

    def __init__(self, cfg: SpecConfig, backend: TreeAttnBackend, device: torch.device):
        super().__init__()
        self.attn = Attention(cfg, backend, device)
        self.backend = backend

    def forward(self, h_last: torch.Tensor, cache: KVCache) -> torch.Tensor:
        q, _, _ = self.attn.project(h_last)
        return self.attn.o(self.backend.forward_draft(q, cache).reshape(h_last.shape[0], -1))


class TreeModel(nn.Module):
    def __init__(self, cfg: SpecConfig, backend: TreeAttnBackend, caches: List[KVCache], device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.blocks = nn.ModuleList([Block(cfg, backend, device) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, device=device, dtype=cfg.dtype)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=cfg.dtype)
        self.draft = DraftHead(cfg, backend, device)
        self.draft_cache = caches[-1]
        self.caches = caches[:-1]

    def verify(self, ids: torch.Tensor, positions: torch.Tensor, loc: torch.Tensor, key: Optional[Key], tree_size: int):
        h = self.embed(ids)
        for blk, cache in zip(self.blocks, self.caches):
            h = blk(h, cache, loc, key)
        h = self.norm(h)
        live = positions >= 0
        logits = self.lm_head(h[live])  # expect: FC101
        roots = h.view(-1, tree_size, h.shape[-1])[:, 0]
        draft_h = self.draft(roots, self.draft_cache)
        return logits, self.lm_head(draft_h)
