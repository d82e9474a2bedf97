"""A small draft LM over the one-token-per-page draft pool, and the target model's verify pass."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from spec_attn.draft_backend import DraftDecodeBackend
from spec_attn.verify_backend import TreeBatch, VerifyBackend
from treespec.config import SpecConfig


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


class DraftModel(nn.Module):
    def __init__(self, cfg: SpecConfig, backend: DraftDecodeBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        d, h, hd = cfg.draft_hidden_size, cfg.draft_num_heads, cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.qkv = nn.Linear(d, 3 * h * hd, bias=False)
        self.o = nn.Linear(h * hd, d, bias=False)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)
        # [slots, 2, heads, 1, head_dim]: one token per page
        self.kv_cache = torch.zeros(cfg.num_draft_slots, 2, h, 1, hd, dtype=cfg.dtype, device=device)

    def _project(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor):
        cfg = self.cfg
        x = self.embed(tokens)
        q, k, v = self.qkv(x).view(-1, 3, cfg.draft_num_heads, cfg.head_dim).unbind(1)
        q, k = _rope(q, positions), _rope(k, positions)
        self.kv_cache[slots, 0, :, 0] = k
        self.kv_cache[slots, 1, :, 0] = v
        return x, q

    def _head(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        x = x + self.o(o.reshape(x.shape[0], -1))
        x = x + self.down(F.gelu(self.up(x)))
        return self.lm_head(x)

    def draft_step(self, tokens, positions, slots, rows: int) -> torch.Tensor:
        x, q = self._project(tokens, positions, slots)
        return self._head(x, self.backend.decode(q, self.kv_cache, rows))

    def extend_root(self, tokens, positions, slots, bs: int) -> torch.Tensor:
        x, q = self._project(tokens, positions, slots)
        logits = self._head(x, self.backend.run_root(q, self.kv_cache))
        return logits[1::2]  # the second query of every pair is the root


class TargetLayer(nn.Module):
    def __init__(self, cfg: SpecConfig):
        super().__init__()
        self.cfg = cfg
        qs, kvs = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.sizes = [qs, kvs, kvs]
        self.norm = nn.LayerNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, qs + 2 * kvs, bias=False)
        self.o = nn.Linear(qs, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.GELU(),
                                 nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def forward(self, x, tb: TreeBatch, kv_cache: torch.Tensor, verify: VerifyBackend) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.qkv(self.norm(x)).split(self.sizes, dim=-1)
        q = _rope(q.view(-1, cfg.num_qo_heads, cfg.head_dim), tb.positions)
        k = _rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), tb.positions)
        kv_cache[tb.slot_pages, 0, :, tb.slot_offsets] = k
        kv_cache[tb.slot_pages, 1, :, tb.slot_offsets] = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        x = x + self.o(verify.run(q, kv_cache).reshape(x.shape[0], -1))
        return x + self.mlp(x)


class TargetModel(nn.Module):
    def __init__(self, cfg: SpecConfig, verify: VerifyBackend, device: torch.device):
        super().__init__()
        self.verify_backend = verify
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([TargetLayer(cfg) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_cache = torch.zeros(cfg.num_layers, cfg.num_target_pages, 2, cfg.num_kv_heads, cfg.page_size,
                                    cfg.head_dim, dtype=cfg.dtype, device=device)

    def verify(self, tb: TreeBatch, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for i, layer in enumerate(self.layers):
            x = layer(x, tb, self.kv_cache[i], self.verify_backend)
        return self.lm_head(x)
