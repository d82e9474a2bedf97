"""A small decoder; attention goes through any backend with the protocol's methods."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from dr_attn.backend import AttentionBackend
from dr_engine.config import EngineConfig


class Block(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.up = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)


class ReplayLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: AttentionBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def _q(self, blk: Block, h: torch.Tensor) -> torch.Tensor:
        return blk.q(blk.norm(h)).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def _mix(self, blk: Block, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + blk.o(o.reshape(o.shape[0], -1))
        return h + blk.down(F.silu(blk.up(h)))

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            h = self._mix(blk, h, self.backend.forward_decode(self._q(blk, h), kv_cache[i], bs))
        return self.head(h)

    def prefill(self, ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor,
                qo_indptr: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            h = self._mix(blk, h, self.backend.forward_prefill(self._q(blk, h), kv_cache[i]))
        return self.head(h.index_select(0, qo_indptr[1:] - 1))
