"""Decoder whose attention reads the band's RoPE table and the band attention."""
from __future__ import annotations

import torch
from torch import nn

from yarnserve.attn.decode import BandDecodeAttention
from yarnserve.rope.cache import BandRopeCache
from yarnserve.rope.yarn import apply_rotary
from yarnserve.settings import ServeSettings
from yarn_engine.batch import DecodeBatch


class YarnAttention(nn.Module):
    def __init__(self, s: ServeSettings, layer_id: int, attn: BandDecodeAttention, rope: BandRopeCache) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.nq, self.nkv, self.hd = s.num_q_heads, s.num_kv_heads, s.head_dim
        self.qkv = nn.Linear(s.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, s.hidden_size, bias=False)
        self.attn = attn
        self.rope = rope

    def _project(self, h: torch.Tensor, positions: torch.Tensor, band_idx: int, batch: DecodeBatch):
        q, k, v = self.qkv(h).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nq, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        q, k = apply_rotary(q, k, self.rope.gather(band_idx, positions))
        self.attn.pool.append(self.layer_id, k, v, batch.out_loc)
        return q

    def forward(self, h: torch.Tensor, positions: torch.Tensor, band_idx: int, batch: DecodeBatch) -> torch.Tensor:
        q = self._project(h, positions, band_idx, batch)
        out = self.attn.forward(q, self.layer_id, batch)
        return self.o_proj(out.reshape(-1, self.nq * self.hd))

    def forward_long(self, h: torch.Tensor, positions: torch.Tensor, band_idx: int, batch: DecodeBatch) -> torch.Tensor:
        q = self._project(h, positions, band_idx, batch)
        out = self.attn.forward_long(q, self.layer_id)
        return self.o_proj(out.reshape(-1, self.nq * self.hd))


class YarnLayer(nn.Module):
    def __init__(self, s: ServeSettings, layer_id: int, attn: BandDecodeAttention, rope: BandRopeCache) -> None:
        super().__init__()
        self.self_attn = YarnAttention(s, layer_id, attn, rope)
        self.ln1 = nn.RMSNorm(s.hidden_size)
        self.ln2 = nn.RMSNorm(s.hidden_size)
        self.up = nn.Linear(s.hidden_size, 4 * s.hidden_size, bias=False)
        self.down = nn.Linear(4 * s.hidden_size, s.hidden_size, bias=False)

    def forward(self, h, positions, band_idx: int, batch: DecodeBatch):
        h = h + self.self_attn(self.ln1(h), positions, band_idx, batch)
        return h + self.down(torch.nn.functional.silu(self.up(self.ln2(h))))

    def forward_long(self, h, positions, band_idx: int, batch: DecodeBatch):
        h = h + self.self_attn.forward_long(self.ln1(h), positions, band_idx, batch)
        return h + self.down(torch.nn.functional.silu(self.up(self.ln2(h))))


class YarnLM(nn.Module):
    def __init__(self, s: ServeSettings, attn: BandDecodeAttention, rope: BandRopeCache, vocab: int = 128256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, s.hidden_size)
        self.layers = nn.ModuleList([YarnLayer(s, i, attn, rope) for i in range(s.num_layers)])
        self.norm = nn.RMSNorm(s.hidden_size)
        self.head = nn.Linear(s.hidden_size, vocab, bias=False)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, band_idx: int, batch: DecodeBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, band_idx, batch)
        return self.head(self.norm(h))

    def decode_long(self, input_ids: torch.Tensor, positions: torch.Tensor, band_idx: int, batch: DecodeBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_long(h, positions, band_idx, batch)
        return self.head(self.norm(h))
