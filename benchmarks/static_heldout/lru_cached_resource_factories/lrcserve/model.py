"""A Llama-shaped decoder whose attention runs through the FlashInfer backend."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
from torch import nn

from .config import EngineConfig
from .forward_batch import ForwardBatch

if TYPE_CHECKING:
    from .attention import FlashInferDecodeBackend


@functools.lru_cache(maxsize=None)
def rope_cache(length: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for positions [0, length); one entry per power-of-two length."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    return freqs.cos(), freqs.sin()


def _next_pow2(n: int) -> int:
    return 1 << (max(n, 2) - 1).bit_length()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    c = cos[positions].unsqueeze(1).to(x.dtype)
    s = sin[positions].unsqueeze(1).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class PagedKVPool:
    """Separate K and V pages per layer, [num_pages, page_size, kv_heads, head_dim] (NHD)."""

    def __init__(self, cfg: EngineConfig, device: torch.device) -> None:
        shape = (cfg.num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]

    def write(self, i: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        kc, vc = self.k[i], self.v[i]
        kc.view(-1, kc.shape[-2], kc.shape[-1]).index_copy_(0, loc, k)
        vc.view(-1, vc.shape[-2], vc.shape[-1]).index_copy_(0, loc, v)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: "FlashInferDecodeBackend") -> None:
        super().__init__()
        self.layer_id = layer_id
        self.sliding_window = layer_id in cfg.window_layers
        self.hq, self.hkv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.hq + 2 * self.hkv) * self.d, bias=False)
        self.o_proj = nn.Linear(self.hq * self.d, cfg.hidden_size, bias=False)
        self.backend = backend

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(h).split([self.hq * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        q = apply_rope(q.view(-1, self.hq, self.d), cos, sin, fb.positions)
        k = apply_rope(k.view(-1, self.hkv, self.d), cos, sin, fb.positions)
        o = self.backend.forward(q, k, v.view(-1, self.hkv, self.d), self, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: "FlashInferDecodeBackend") -> None:
        super().__init__()
        self.input_norm = nn.RMSNorm(cfg.hidden_size)
        self.attn = LlamaAttention(cfg, layer_id, backend)
        self.post_norm = nn.RMSNorm(cfg.hidden_size)
        self.mlp = LlamaMLP(cfg)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.attn(self.input_norm(h), cos, sin, fb)
        return h + self.mlp(self.post_norm(h))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: "FlashInferDecodeBackend") -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.embed_tokens(fb.input_ids)
        # cos/sin cached per power-of-two span of the positions in this batch
        span = _next_pow2(int(fb.positions.max()) + 1)  # expect: FC101
        cos, sin = rope_cache(span, self.cfg.head_dim, self.cfg.rope_theta, h.device)
        for layer in self.layers:
            h = layer(h, cos, sin, fb)
        h = self.norm(h)
        return self.lm_head(h), h
