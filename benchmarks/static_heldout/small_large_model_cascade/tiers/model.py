"""A decoder-only LM used for both tiers (sizes from the tier's ModelSpec)."""

from __future__ import annotations

import torch
from torch import nn

from cascade.config import ModelSpec
from tiers.attention import TierAttention
from tiers.batch import PrefillBatch, TierBatch


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.nq, self.nkv, self.hd = spec.num_qo_heads, spec.num_kv_heads, spec.head_dim
        self.norm1 = nn.RMSNorm(spec.hidden_size)
        self.norm2 = nn.RMSNorm(spec.hidden_size)
        self.qkv = nn.Linear(spec.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, spec.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(spec.hidden_size, 4 * spec.hidden_size), nn.GELU(),
                                 nn.Linear(4 * spec.hidden_size, spec.hidden_size))

    def _qkv(self, h: torch.Tensor):
        q, k, v = self.qkv(self.norm1(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        return q.view(-1, self.nq, self.hd), k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd)

    def decode(self, h: torch.Tensor, batch: TierBatch, attn: TierAttention) -> torch.Tensor:
        q, k, v = self._qkv(h)
        h = h + self.o(attn.forward_decode(q, k, v, self.layer_id, batch).reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))

    def prefill(self, h: torch.Tensor, pb: PrefillBatch, attn: TierAttention) -> torch.Tensor:
        q, k, v = self._qkv(h)
        h = h + self.o(attn.forward_prefill(q, k, v, self.layer_id, pb).reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))


class TierLM(nn.Module):
    def __init__(self, spec: ModelSpec, attn: TierAttention):
        super().__init__()
        self.attn = attn
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(spec, i) for i in range(spec.num_layers)])
        self.norm = nn.RMSNorm(spec.hidden_size)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: TierBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, batch, self.attn)
        return self.lm_head(self.norm(h))

    def prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, pb: PrefillBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.prefill(h, pb, self.attn)
        return self.lm_head(self.norm(h))
