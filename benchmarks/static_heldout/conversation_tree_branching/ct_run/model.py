"""A decoder whose attention layers read the paged KV of the active branches."""
from typing import List

import torch
from torch import nn

from convtree import ChatServerConfig
from ct_attn.backend import TreeAttnBackend
from ct_attn.metadata import TreeStepMeta


class TreeAttnLayer(nn.Module):
    def __init__(self, cfg: ChatServerConfig, backend: TreeAttnBackend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def decode(self, h: torch.Tensor, kv: torch.Tensor, bs: int, meta: TreeStepMeta) -> torch.Tensor:
        return h + self.o_proj(self.backend.forward_decode(self._q(h), kv, bs, meta).flatten(1))

    def extend(self, h: torch.Tensor, kv: torch.Tensor, meta: TreeStepMeta) -> torch.Tensor:
        return h + self.o_proj(self.backend.forward_extend(self._q(h), kv, meta).flatten(1))


class ChatModel(nn.Module):
    def __init__(self, cfg: ChatServerConfig, backend: TreeAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([TreeAttnLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], bs: int, meta: TreeStepMeta) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.decode(h, kv, bs, meta)
        return h

    def extend(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], meta: TreeStepMeta) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.extend(h, kv, meta)
        return h
