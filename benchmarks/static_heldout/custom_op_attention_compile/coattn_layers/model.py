from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from coattn.config import CompileServeConfig
from coattn_layers.attention import Attention, FlashInferImpl


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: CompileServeConfig, idx: int):
        super().__init__()
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_out = cfg.num_qo_heads * cfg.head_dim
        kv_out = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_out + 2 * kv_out, bias=True)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=False)
        self.attn = Attention(f"model.layers.{idx}.self_attn", cfg.num_qo_heads, cfg.head_dim)
        self.input_norm = nn.RMSNorm(cfg.hidden_size)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor):
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        q, k, v = self.qkv_proj(self.input_norm(h)).split([q_out, kv_out, kv_out], dim=-1)
        q = apply_rope(q.view(-1, self.num_heads, self.head_dim), positions, inv_freq)
        k = apply_rope(k.view(-1, self.num_kv_heads, self.head_dim), positions, inv_freq)
        return q, k, v.view(-1, self.num_kv_heads, self.head_dim)

    def _mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(gate) * up)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions, inv_freq)
        h = h + self.o_proj(self.attn(q, k, v).flatten(1))
        return self._mlp(h)

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions, inv_freq)
        h = h + self.o_proj(self.attn.forward_decode(q, k, v).flatten(1))
        return self._mlp(h)


class CompiledDecoder(nn.Module):
    def __init__(self, cfg: CompileServeConfig, impls: Dict[str, FlashInferImpl]):
        super().__init__()
        self.impls = impls
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, self.inv_freq)
        return self.norm(h)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, self.inv_freq)
        return self.norm(h)
