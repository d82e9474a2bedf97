"""Decoder model; every layer keeps the backend it was handed as `attn_impl`."""

from __future__ import annotations

import torch
from flashinfer.rope import apply_rope_pos_ids_inplace
from torch import nn

from ccbi.config import EngineConfig
from ccbi.forward_batch import ForwardBatch
from ccbi_attn.base import AttentionBackend


def _check_window(window: int, max_context_len: int) -> None:
    assert 0 <= window < max_context_len, (window, max_context_len)  # expect: FC109


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, attn_backend: AttentionBackend):
        super().__init__()
        self.layer_id, self.attn_impl = layer_id, attn_backend
        self.window = cfg.sliding_window if layer_id in cfg.window_layers else 0
        _check_window(self.window, cfg.max_context_len)
        self.nq, self.nkv, self.hd, h = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
        self.norm1, self.norm2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.qkv = nn.Linear(h, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, h, bias=False)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h, bias=False), nn.SiLU(), nn.Linear(4 * h, h, bias=False))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch):
        q, k, v = self.qkv(self.norm1(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q, k, v = q.view(-1, self.nq, self.hd), k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd)
        apply_rope_pos_ids_inplace(q, k, positions, rope_theta=5e5)
        self.attn_impl.save_kv(self.layer_id, k, v, fb.out_cache_loc)
        return q, k, v

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(-1, self.nq * self.hd))
        return h + self.mlp(self.norm2(h))

    def forward(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, positions, fb)
        return self._finish(h, self.attn_impl.forward(q, k, v, self, fb))

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(h, positions, fb)
        return self._finish(h, self.attn_impl.forward_decode(q, k, v, self, fb))


class Model(nn.Module):
    def __init__(self, cfg: EngineConfig, attn: AttentionBackend):
        super().__init__()
        self.attn = attn
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, self.attn) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, fb)
        if not fb.is_decode:
            h = h[fb.qo_indptr[1:] - 1]  # ok: FC101
        return self.lm_head(self.norm(h))

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, fb)
        return self.lm_head(self.norm(h))
