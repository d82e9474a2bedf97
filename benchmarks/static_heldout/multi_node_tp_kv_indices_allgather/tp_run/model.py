"""A tensor-parallel decoder: column-parallel QKV, row-parallel output with an all-reduce."""
from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist
from torch import nn

from tpdist import TPConfig
from tp_attn.backend import RankAttnBackend


class RowParallelLinear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup):
        super().__init__(in_features, out_features, bias=False, dtype=torch.bfloat16)
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out, group=self.group)
        return out


class TPAttention(nn.Module):
    def __init__(self, cfg: TPConfig, backend: RankAttnBackend, group: dist.ProcessGroup):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.q_size = cfg.heads_per_rank * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * cfg.kv_heads_per_rank * cfg.head_dim,
                             bias=False, dtype=torch.bfloat16)
        self.o = RowParallelLinear(self.q_size, cfg.hidden_size, group)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.qkv(h)[:, : self.q_size].view(-1, self.cfg.heads_per_rank, self.cfg.head_dim)

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.o(self.backend.forward_decode(self._q(h), kv_cache).flatten(1))

    def forward_prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.o(self.backend.forward_prefill(self._q(h), kv_cache).flatten(1))


class TPModel(nn.Module):
    def __init__(self, cfg: TPConfig, backend: RankAttnBackend, group: dist.ProcessGroup,
                 kv_caches: List[torch.Tensor]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=torch.bfloat16)
        self.attns = nn.ModuleList(TPAttention(cfg, backend, group) for _ in range(cfg.num_layers))
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch.bfloat16)
        self.kv_caches = kv_caches

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for attn, kv in zip(self.attns, self.kv_caches):
            h = h + attn.forward_decode(h, kv)
        return self.head(h)

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for attn, kv in zip(self.attns, self.kv_caches):
            h = h + attn.forward_prefill(h, kv)
        return self.head(h)
