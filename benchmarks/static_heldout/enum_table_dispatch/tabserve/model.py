"""A Llama-shaped decoder whose attention layers call the table-driven backend."""

from __future__ import annotations

from typing import List, Tuple

import torch
from torch import nn

from tabserve.attention.backend import FlashInferTableBackend
from tabserve.batch import ForwardBatch
from tabserve.config import EngineConfig, ModelConfig
from tabserve.modes import ForwardMode


class PagedKVPool:
    """Per-layer paged KV cache in FlashInfer's NHD layout: [pages, 2, page_size, kv_heads, head_dim]."""

    def __init__(self, model_cfg: ModelConfig, cfg: EngineConfig, device: torch.device) -> None:
        shape = (cfg.num_pages, 2, cfg.page_size, model_cfg.num_kv_heads, model_cfg.head_dim)
        self.page_size = cfg.page_size
        self.kv: List[torch.Tensor] = [
            torch.zeros(shape, dtype=model_cfg.dtype, device=device) for _ in range(model_cfg.num_layers)
        ]

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        cache = self.kv[layer_id]
        page, slot = loc // self.page_size, loc % self.page_size
        cache[page, 0, slot] = k
        cache[page, 1, slot] = v


def _rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    cos, sin = freqs.cos()[:, None, :], freqs.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, model_cfg: ModelConfig, backend: FlashInferTableBackend, pool: PagedKVPool):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = model_cfg.num_qo_heads
        self.num_kv_heads = model_cfg.num_kv_heads
        self.head_dim = model_cfg.head_dim
        self.scaling = model_cfg.head_dim**-0.5
        self.is_sliding = model_cfg.sliding_window > 0 and layer_id % model_cfg.sliding_window_pattern == 0
        self.window_left = model_cfg.sliding_window - 1 if self.is_sliding else -1
        self.backend = backend
        self.pool = pool

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q = q.view(-1, self.num_qo_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        self.pool.store(self.layer_id, fb.out_cache_loc, k, v)
        out = self.backend.forward(q, k, v, self, fb)
        return out.reshape(-1, self.num_qo_heads * self.head_dim)


class DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, model_cfg: ModelConfig, backend: FlashInferTableBackend, pool: PagedKVPool):
        super().__init__()
        h, d = model_cfg.hidden_size, model_cfg.head_dim
        self.q_size = model_cfg.num_qo_heads * d
        self.kv_size = model_cfg.num_kv_heads * d
        self.theta = model_cfg.rope_theta
        self.input_norm = nn.RMSNorm(h)
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=False)
        self.attn = RadixAttention(layer_id, model_cfg, backend, pool)
        self.o_proj = nn.Linear(self.q_size, h, bias=False)
        self.post_norm = nn.RMSNorm(h)
        self.gate_up = nn.Linear(h, 2 * model_cfg.intermediate_size, bias=False)
        self.down = nn.Linear(model_cfg.intermediate_size, h, bias=False)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        d = self.attn.head_dim
        q = _rotary(q.view(-1, self.attn.num_qo_heads, d), positions, self.theta)
        k = _rotary(k.view(-1, self.attn.num_kv_heads, d), positions, self.theta)
        return q, k, v

    def forward(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._qkv(self.input_norm(h), fb.positions)
        h = h + self.o_proj(self.attn(q, k, v, fb))
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(gate) * up)


class TinyDecoder(nn.Module):
    def __init__(self, model_cfg: ModelConfig, backend: FlashInferTableBackend, pool: PagedKVPool):
        super().__init__()
        self.vocab_size = model_cfg.vocab_size
        self.embed = nn.Embedding(model_cfg.vocab_size, model_cfg.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(i, model_cfg, backend, pool) for i in range(model_cfg.num_layers)]
        )
        self.norm = nn.RMSNorm(model_cfg.hidden_size)
        self.lm_head = nn.Linear(model_cfg.hidden_size, model_cfg.vocab_size, bias=False)

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = layer(h, fb)
        if fb.forward_mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
            # Only the last token of each request is sampled.
            h = h[fb.qo_offsets[1:].long() - 1]
        return self.lm_head(self.norm(h))
