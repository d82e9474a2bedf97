"""One decoder class for the draft model, the target model and the verifier view."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from specroll.config import ModelDims

Attend = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


class Block(nn.Module):
    def __init__(self, dims: ModelDims):
        super().__init__()
        qkv = (dims.num_qo_heads + 2 * dims.num_kv_heads) * dims.head_dim
        self.norm = nn.RMSNorm(dims.hidden)
        self.qkv = nn.Linear(dims.hidden, qkv, bias=False)
        self.o = nn.Linear(dims.num_qo_heads * dims.head_dim, dims.hidden, bias=False)
        self.up = nn.Linear(dims.hidden, 3 * dims.hidden, bias=False)
        self.down = nn.Linear(3 * dims.hidden, dims.hidden, bias=False)


class SpecLM(nn.Module):
    def __init__(self, dims: ModelDims, vocab: int, attend: Attend,
                 extend_attend: Optional[Attend] = None, shared: Optional["SpecLM"] = None):
        super().__init__()
        self.dims = dims
        self.attend = attend
        self.extend_attend = extend_attend
        if shared is not None:
            self.embed, self.blocks, self.head = shared.embed, shared.blocks, shared.head
        else:
            self.embed = nn.Embedding(vocab, dims.hidden)
            self.blocks = nn.ModuleList([Block(dims) for _ in range(dims.num_layers)])
            self.head = nn.Linear(dims.hidden, vocab, bias=False)

    def _q(self, blk: Block, h: torch.Tensor) -> torch.Tensor:
        d = self.dims
        q = blk.qkv(blk.norm(h))[:, : d.num_qo_heads * d.head_dim]
        return q.view(-1, d.num_qo_heads, d.head_dim)

    def _mix(self, blk: Block, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + blk.o(o.reshape(o.shape[0], -1))
        return h + blk.down(F.silu(blk.up(h)))

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            h = self._mix(blk, h, self.attend(self._q(blk, h), kv_cache[i], bs))
        return self.head(h)

    def extend(self, ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        if self.extend_attend is None:
            raise RuntimeError("this model view has no extend attention")
        h = self.embed(ids)
        for i, blk in enumerate(self.blocks):
            h = self._mix(blk, h, self.extend_attend(self._q(blk, h), kv_cache[i], bs))
        return self.head(h)
