"""A Qwen-shaped decoder whose attention splits heads between the two KV pools."""

from typing import List, Optional

import torch
from torch import nn

from razor import HeadRouter, RazorConfig
from rz_attn.backend import RazorBackend


class RazorAttention(nn.Module):
    def __init__(self, cfg: RazorConfig, layer_id: int, backend: RazorBackend, router: HeadRouter):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.router = router
        self.dense = layer_id < cfg.dense_layers
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=True)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, h: torch.Tensor, full_cache: torch.Tensor, comp_cache: torch.Tensor,
                bs: Optional[int]) -> torch.Tensor:
        c = self.cfg
        q = self.q_proj(h).view(h.shape[0], c.num_qo_heads, c.head_dim)
        if self.dense:
            out = self.backend.dense_full.run(q, full_cache)  # expect: FC108
            return self.o_proj(out.reshape(h.shape[0], -1))
        q_ret, q_comp = self.router.split(q, self.layer_id)
        full_w = self.backend.full_graph[bs] if bs is not None else self.backend.full_eager
        comp_w = self.backend.comp_graph.get(bs) or self.backend.comp_eager
        o_ret = full_w.run(q_ret, full_cache)
        o_comp = comp_w.run(q_comp, comp_cache)  # ok: FC108
        out = self.router.merge(o_ret, o_comp, self.layer_id)
        return self.o_proj(out.reshape(h.shape[0], -1))


class RazorLM(nn.Module):
    def __init__(self, cfg: RazorConfig, backend: RazorBackend, router: HeadRouter):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([RazorAttention(cfg, i, backend, router) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.full_caches: List[torch.Tensor] = []
        self.comp_caches: List[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, fc, cc in zip(self.layers, self.full_caches, self.comp_caches):
            h = h + layer(h, fc, cc, bs)
        return self.lm_head(self.norm(h))
