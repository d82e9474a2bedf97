"""Decoder whose attention goes through the Quest backend."""

from typing import List

import torch
from torch import nn

from quest.config import QuestConfig
from quest.sparse_backend import QuestAttnBackend


class QuestLayer(nn.Module):
    def __init__(self, cfg: QuestConfig, layer_id: int, backend: QuestAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        q_dim = cfg.num_qo_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden_size)

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q_proj(self.norm(h)).view(bs, self.cfg.num_qo_heads, self.cfg.head_dim)
        o = self.backend.forward_decode(self.layer_id, q, kv_cache, bs)
        return h + self.o_proj(o.reshape(bs, -1))


class QuestModel(nn.Module):
    def __init__(self, cfg: QuestConfig, backend: QuestAttnBackend, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([QuestLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def forward(self, input_ids: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv, bs)
        return self.lm_head(h)
