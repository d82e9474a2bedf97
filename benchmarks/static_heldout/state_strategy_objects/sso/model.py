"""A decoder-only model whose attention layers call whatever strategy the runner currently holds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from sso.config import EngineConfig
from sso.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from sso.model_runner import GPUModelRunner


class AttentionLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, runner: "GPUModelRunner") -> None:
        super().__init__()
        self.layer_id = layer_id
        self.runner = runner
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        qkv = self.qkv(h)
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        kv_cache = self.runner.kv_caches[self.layer_id]
        out = self.runner.strategy.forward(q, kv_cache, batch, k=k, v=v)
        return self.o(out.reshape(-1, q_size))


class TinyDecoder(nn.Module):
    def __init__(self, cfg: EngineConfig, runner: "GPUModelRunner") -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AttentionLayer(cfg, i, runner) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = h + layer(h, batch)
        return self.norm(h)
