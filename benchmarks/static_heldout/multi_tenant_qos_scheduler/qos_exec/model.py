from typing import List

import torch
from torch import nn

from qos_exec.backend import AttnShape, QoSAttentionBackend
from qos_exec.metadata import QoSStepMeta


class Block(nn.Module):
    def __init__(self, hidden: int, shape: AttnShape, backend: QoSAttentionBackend):
        super().__init__()
        self.shape = shape
        self.backend = backend
        self.norm = nn.LayerNorm(hidden)
        self.q = nn.Linear(hidden, shape.num_qo_heads * shape.head_dim, bias=False)
        self.o = nn.Linear(shape.num_qo_heads * shape.head_dim, hidden, bias=False)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q(self.norm(h)).view(-1, self.shape.num_qo_heads, self.shape.head_dim)

    def forward(self, h: torch.Tensor, kv: torch.Tensor, meta: QoSStepMeta, bs: int) -> torch.Tensor:
        return h + self.o(self.backend.forward_decode(self._q(h), kv, meta, bs).flatten(1))

    def prefill(self, h: torch.Tensor, kv: torch.Tensor, resumed: bool) -> torch.Tensor:
        return h + self.o(self.backend.forward_prefill(self._q(h), kv, resumed).flatten(1))


class QoSModel(nn.Module):
    def __init__(self, hidden: int, layers: int, vocab: int, shape: AttnShape, backend: QoSAttentionBackend):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.blocks = nn.ModuleList([Block(hidden, shape, backend) for _ in range(layers)])
        self.head = nn.Linear(hidden, vocab, bias=False)

    def decode(self, ids: torch.Tensor, kv_caches: List[torch.Tensor], meta: QoSStepMeta, bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for blk, kv in zip(self.blocks, kv_caches):
            h = blk(h, kv, meta, bs)
        return self.head(h)

    def prefill(self, ids: torch.Tensor, kv_caches: List[torch.Tensor], resumed: bool) -> torch.Tensor:
        h = self.embed(ids)
        for blk, kv in zip(self.blocks, kv_caches):
            h = blk.prefill(h, kv, resumed)
        return self.head(h)
