"""Llama-4-style decoder: chunked local RoPE layers, one global NoPE layer in every ``nope_layer_interval``."""

from __future__ import annotations

from typing import Dict, List, Union

import torch
from torch import nn

from l4serve.attention.flashinfer_backend import (
    ChunkedLocalAttentionImpl,
    FlashInferImpl,
    FlashInferMetadata,
    LocalAttentionMetadata,
    write_kv,
)
from l4serve.config import Llama4Config

GroupMetadata = Dict[str, Union[FlashInferMetadata, LocalAttentionMetadata]]


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None, None] * inv
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], -1).to(x.dtype)


class Llama4DecoderLayer(nn.Module):
    def __init__(self, cfg: Llama4Config, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.is_local = cfg.is_local_layer(layer_idx)
        self.group = "local" if self.is_local else "global"
        q_size, kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.input_norm = nn.RMSNorm(cfg.hidden_size)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        inter = int(8 * cfg.hidden_size / 3)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * inter, bias=False)
        self.down = nn.Linear(inter, cfg.hidden_size, bias=False)
        if self.is_local:
            self.impl = ChunkedLocalAttentionImpl(cfg)
        else:
            self.impl = FlashInferImpl(cfg)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        c = self.cfg
        q, k, v = self.qkv_proj(self.input_norm(h)).split(self.sizes, dim=-1)
        q, k = q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim)
        if self.is_local:
            q, k = rope(q, positions), rope(k, positions)
        else:
            # NoPE layers: attention temperature tuning grows with the position
            scale = torch.log1p(torch.floor((positions.float() + 1) / 8192.0)) * 0.1 + 1.0
            q = (q.float() * scale[:, None, None]).to(q.dtype)
        return q, k, v.view(-1, c.num_kv_heads, c.head_dim)

    def _finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(attn.flatten(1))
        g, u = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(g) * u)

    def forward(self, h, positions, kv_cache, metas: GroupMetadata):
        q, k, v = self._qkv(h, positions)
        return self._finish(h, self.impl.forward(q, k, v, kv_cache, metas[self.group]))

    def forward_decode(self, h, positions, kv_cache, metas: GroupMetadata):
        q, k, v = self._qkv(h, positions)
        meta = metas[self.group]
        write_kv(k, v, kv_cache, meta.slot_mapping)
        return self._finish(h, self.impl.forward_decode(q, kv_cache, meta))


class Llama4ForCausalLM(nn.Module):
    def __init__(self, cfg: Llama4Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Llama4DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches: List[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, metas: GroupMetadata) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, positions, kv, metas)
        return self.lm_head(self.norm(h))

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, metas: GroupMetadata) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.forward_decode(h, positions, kv, metas)
        return self.lm_head(self.norm(h))
