"""A Llama-shaped decoder whose attention goes through ``FlashInferBackend``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from memprof.limits import EngineLimits
from memprof_rt.metadata import StepMetadata

if TYPE_CHECKING:
    from memprof_rt.attn_backend import FlashInferBackend


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.float().unsqueeze(-1) * inv
    cos, sin = ang.cos().unsqueeze(1), ang.sin().unsqueeze(1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, limits: EngineLimits, backend: "FlashInferBackend") -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        h, d = limits.hidden_size, limits.head_dim
        self.nq, self.nkv, self.d = limits.num_qo_heads, limits.num_kv_heads, d
        self.qkv = nn.Linear(h, (self.nq + 2 * self.nkv) * d, bias=False)
        self.o_proj = nn.Linear(self.nq * d, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * limits.intermediate_size, bias=False)
        self.down = nn.Linear(limits.intermediate_size, h, bias=False)
        self.ln1 = nn.RMSNorm(h)
        self.ln2 = nn.RMSNorm(h)

    def _qkv(self, x: torch.Tensor, meta: StepMetadata):
        q, k, v = self.qkv(self.ln1(x)).split([self.nq * self.d, self.nkv * self.d, self.nkv * self.d], dim=-1)
        q = _rope(q.view(-1, self.nq, self.d), meta.positions)
        k = _rope(k.view(-1, self.nkv, self.d), meta.positions)
        self.backend.store_kv(self.layer_id, k, v.view(-1, self.nkv, self.d), meta.out_cache_loc)
        return q

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(self.ln2(x)).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)

    def decode(self, x: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        q = self._qkv(x, meta)
        x = x + self.o_proj(self.backend.decode_attention(q, self.layer_id, meta).flatten(1))
        return x + self._mlp(x)

    def decode_long(self, x: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        q = self._qkv(x, meta)
        x = x + self.o_proj(self.backend.trtllm_decode_attention(q, self.layer_id, meta).flatten(1))
        return x + self._mlp(x)

    def extend(self, x: torch.Tensor, meta: StepMetadata) -> torch.Tensor:
        q = self._qkv(x, meta)
        x = x + self.o_proj(self.backend.extend_attention(q, self.layer_id, meta).flatten(1))
        return x + self._mlp(x)


class TinyDecoder(nn.Module):
    def __init__(self, limits: EngineLimits, backend: "FlashInferBackend") -> None:
        super().__init__()
        self.limits = limits
        self.embed = nn.Embedding(limits.vocab_size, limits.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(i, limits, backend) for i in range(limits.num_layers)])
        self.norm = nn.RMSNorm(limits.hidden_size)
        self.lm_head = nn.Linear(limits.hidden_size, limits.vocab_size, bias=False)

    def forward_decode(self, meta: StepMetadata) -> torch.Tensor:
        h = self.embed(meta.input_ids)
        for layer in self.layers:
            h = layer.decode(h, meta)
        return self.lm_head(self.norm(h))

    def forward_decode_long(self, meta: StepMetadata) -> torch.Tensor:
        h = self.embed(meta.input_ids)
        for layer in self.layers:
            h = layer.decode_long(h, meta)
        return self.lm_head(self.norm(h))

    def forward_extend(self, meta: StepMetadata) -> torch.Tensor:
        h = self.embed(meta.input_ids)
        for layer in self.layers:
            h = layer.extend(h, meta)
        last = meta.qo_indptr[1:] - 1
        return self.lm_head(self.norm(h.index_select(0, last.long())))
