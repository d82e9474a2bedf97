"""The decode node's model: full attention on even layers, sliding window on odd ones."""

from __future__ import annotations

import torch
import torch.nn as nn

from kvx import TransferConfig
from kx_decode.backend import DecodeAttnBackend


class Layer(nn.Module):
    def __init__(self, cfg: TransferConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)


class DecodeModel(nn.Module):
    def __init__(self, cfg: TransferConfig, backend: DecodeAttnBackend, rope_base: float = 500000.0):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.orig_ctx = 8192
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        inv = 1.0 / rope_base ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        self.register_buffer("inv_freq", inv, persistent=False)

    def _rope(self, q: torch.Tensor, positions: torch.Tensor, max_len: int) -> torch.Tensor:
        scale = 1.0 if max_len <= self.orig_ctx else max_len / self.orig_ctx
        freqs = positions[:, None].float() / scale * self.inv_freq[None, :]
        cos, sin, q1, q2 = freqs.cos()[:, None, :], freqs.sin()[:, None, :], q[..., ::2], q[..., 1::2]
        return torch.stack([q1 * cos - q2 * sin, q1 * sin + q2 * cos], dim=-1).flatten(-2)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, max_len: int):
        h = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            q = layer.q_proj(layer.norm(h)).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)
            out = self.backend.forward_decode(self._rope(q, positions, max_len), kv_cache[:, i], i)
            h = h + layer.o_proj(out.flatten(1))
        return self.lm_head(h)

    def forward_tail(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor):
        h = self.embed(input_ids)
        for i, layer in enumerate(self.layers):
            q = layer.q_proj(layer.norm(h)).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)
            out = self.backend.forward_tail(self._rope(q, positions, self.cfg.max_context), kv_cache[:, i])
            h = h + layer.o_proj(out.flatten(1))
        return self.lm_head(h)
