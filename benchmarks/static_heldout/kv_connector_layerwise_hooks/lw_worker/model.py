"""A Llama-shaped decoder whose attention layers call the connector hooks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch
from torch import nn

from kvconn.config import EngineConfig
from kvconn.connector import LayerwiseConnectorWorker
from lw_worker.attn_backend import FlashInferAttentionBackend, FlashInferStepMetadata


@dataclass
class StepBatch:
    num_reqs: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    has_loads: bool = False
    has_saves: bool = False


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2 :].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class LayerwiseAttention(nn.Module):
    def __init__(
        self,
        layer_idx: int,
        cfg: EngineConfig,
        backend: FlashInferAttentionBackend,
        connector: Optional[LayerwiseConnectorWorker],
    ):
        super().__init__()
        self.layer_idx = layer_idx
        self.h, self.kvh, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.backend = backend
        self.connector = connector

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = apply_rope(q.view(-1, self.h, self.d), positions)
        k = apply_rope(k.view(-1, self.kvh, self.d), positions)
        return q, k, v.view(-1, self.kvh, self.d)

    def forward(self, x, positions, kv_cache, meta: FlashInferStepMetadata, fb: StepBatch):
        q, k, v = self._qkv(x, positions)
        if self.connector is not None and fb.has_loads:
            self.connector.wait_for_layer_load(self.layer_idx)
        out = self.backend.forward(q, k, v, kv_cache, meta)
        if self.connector is not None and fb.has_saves:
            self.connector.save_kv_layer(self.layer_idx, kv_cache, meta)
        return self.o_proj(out.reshape(x.shape[0], -1))

    def forward_decode(self, x, positions, kv_cache, meta: FlashInferStepMetadata):
        q, k, v = self._qkv(x, positions)
        out = self.backend.forward_decode(q, k, v, kv_cache, meta)
        return self.o_proj(out.reshape(x.shape[0], -1))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(g) * u)


class DecoderLayer(nn.Module):
    def __init__(self, i: int, cfg: EngineConfig, backend, connector):
        super().__init__()
        self.input_norm = nn.RMSNorm(cfg.hidden_size)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.self_attn = LayerwiseAttention(i, cfg, backend, connector)
        self.mlp = MLP(cfg.hidden_size, cfg.hidden_size * 7 // 2)

    def forward(self, h, positions, kv_cache, meta, fb):
        h = h + self.self_attn(self.input_norm(h), positions, kv_cache, meta, fb)
        return h + self.mlp(self.post_norm(h))

    def forward_decode(self, h, positions, kv_cache, meta):
        h = h + self.self_attn.forward_decode(self.input_norm(h), positions, kv_cache, meta)
        return h + self.mlp(self.post_norm(h))


class LayerwiseModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferAttentionBackend, connector: Optional[LayerwiseConnectorWorker]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(i, cfg, backend, connector) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, positions, kv_caches: List[torch.Tensor], meta, fb: StepBatch):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, positions, kv, meta, fb)
        return self.norm(h)

    def forward_decode(self, input_ids, positions, kv_caches: List[torch.Tensor], meta):
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_decode(h, positions, kv, meta)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
