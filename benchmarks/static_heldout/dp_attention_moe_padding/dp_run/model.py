from __future__ import annotations

from typing import List

import torch
from torch import nn

from dpmoe import DPConfig, MoEPadPlan
from dp_attn.backend import DPAttentionBackend
from dp_moe.moe import EPMoE


class DPLayer(nn.Module):
    def __init__(self, cfg: DPConfig, backend: DPAttentionBackend, group, device: torch.device) -> None:
        super().__init__()
        self.cfg, self.backend = cfg, backend
        q, kv = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.sizes = [q, kv, kv]
        self.qkv = nn.Linear(cfg.hidden_size, q + 2 * kv, bias=False)
        self.o_proj = nn.Linear(q, cfg.hidden_size, bias=False)
        self.moe = EPMoE(cfg, group, device)

    def _q_and_write(self, h: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv(h).split(self.sizes, dim=-1)
        flat = kv_cache.view(-1, 2, c.num_kv_heads, c.head_dim)
        flat[slots] = torch.stack([k.view(-1, c.num_kv_heads, c.head_dim), v.view(-1, c.num_kv_heads, c.head_dim)], 1)
        return q.view(-1, c.num_qo_heads, c.head_dim)

    def forward_graph(self, h, kv_cache, slots):
        attn = self.backend.forward_graph(self._q_and_write(h, kv_cache, slots), kv_cache)
        h = h + self.o_proj(attn.flatten(1))
        return h + self.moe(h)

    def forward_eager(self, h, kv_cache, slots):
        attn = self.backend.forward_eager(self._q_and_write(h, kv_cache, slots), kv_cache)
        h = h + self.o_proj(attn.flatten(1))
        return h + self.moe(h)


class DPModel(nn.Module):
    def __init__(self, cfg: DPConfig, backend: DPAttentionBackend, group, kv_caches: List[torch.Tensor], device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DPLayer(cfg, backend, group, device) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def set_pad_plan(self, plan: MoEPadPlan) -> None:
        for layer in self.layers:
            layer.moe.plan = plan

    def forward_graph(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_graph(h, kv, slots)
        return self.lm_head(h)

    def forward_eager(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_eager(h, kv, slots)
        return self.lm_head(h)
