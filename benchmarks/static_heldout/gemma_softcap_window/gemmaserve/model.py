"""A Gemma-2/3 style decoder whose attention goes through GemmaFlashInferBackend.

Decode (``forward``) is what the graph runner captures; prefill (``prefill``) always runs eagerly.
"""

from __future__ import annotations

import math
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from gemmaserve.attn.backend import GemmaFlashInferBackend
from gemmaserve.common import GemmaConfig, LayerType


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    h = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.float())).to(x.dtype)


def _rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv_freq = base ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) / half)
    freqs = positions.float()[:, None, None] * inv_freq
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * freqs.cos() - x2 * freqs.sin(), x2 * freqs.cos() + x1 * freqs.sin()], -1).to(x.dtype)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: GemmaConfig, layer_id: int, backend: GemmaFlashInferBackend) -> None:
        super().__init__()
        self.cfg, self.layer_id, self.backend = cfg, layer_id, backend
        # Gemma-3: local layers keep rope base 10k, global layers use 1M
        self.rope_base = 10_000.0 if cfg.layer_type(layer_id) is LayerType.SLIDING else 1_000_000.0
        d, hd = cfg.hidden_size, cfg.head_dim
        self.sizes = [cfg.num_qo_heads * hd, cfg.num_kv_heads * hd, cfg.num_kv_heads * hd]
        self.qkv_proj = nn.Linear(d, sum(self.sizes), bias=False)
        self.o_proj = nn.Linear(self.sizes[0], d, bias=False)
        self.norms = nn.Parameter(torch.zeros(4, d))  # input, post-attn, pre-ffn, post-ffn
        self.gate_up = nn.Linear(d, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, d, bias=False)

    def _qkv(self, h, positions, out_cache_loc, kv_cache):
        q, k, v = self.qkv_proj(_rms(h, self.norms[0])).split(self.sizes, dim=-1)
        hd = self.cfg.head_dim
        q = _rope(q.view(-1, self.cfg.num_qo_heads, hd), positions, self.rope_base)
        k = _rope(k.view(-1, self.cfg.num_kv_heads, hd), positions, self.rope_base)
        page, off = out_cache_loc // self.cfg.page_size, out_cache_loc % self.cfg.page_size
        kv_cache[page, 0, off] = k
        kv_cache[page, 1, off] = v.view(-1, self.cfg.num_kv_heads, hd)
        return q

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + _rms(self.o_proj(o.reshape(o.shape[0], -1)), self.norms[1])
        gate, up = self.gate_up(_rms(h, self.norms[2])).chunk(2, dim=-1)
        return h + _rms(self.down(F.gelu(gate, approximate="tanh") * up), self.norms[3])

    def forward(self, h, positions, out_cache_loc, kv_cache):
        q = self._qkv(h, positions, out_cache_loc, kv_cache)
        return self._finish(h, self.backend.forward_decode(q, kv_cache, self.layer_id))

    def prefill(self, h, positions, out_cache_loc, kv_cache):
        q = self._qkv(h, positions, out_cache_loc, kv_cache)
        return self._finish(h, self.backend.forward_extend(q, kv_cache, self.layer_id))


class GemmaForCausalLM(nn.Module):
    """Returns raw logits; the final soft-cap is applied by the runner, outside the captured graph."""

    def __init__(self, cfg: GemmaConfig, backend: GemmaFlashInferBackend) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers))
        self.final_norm = nn.Parameter(torch.zeros(cfg.hidden_size))
        self.normalizer = math.sqrt(cfg.hidden_size)

    def allocate_kv_caches(self, num_pages: int, device: torch.device) -> List[torch.Tensor]:
        shape = (num_pages, 2, self.cfg.page_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        return [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(self.cfg.num_layers)]

    def forward(self, input_ids, positions, out_cache_loc, kv_caches):
        h = self.embed_tokens(input_ids) * self.normalizer
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, positions, out_cache_loc, kv)
        return F.linear(_rms(h, self.final_norm), self.embed_tokens.weight).float()

    def prefill(self, input_ids, positions, out_cache_loc, kv_caches, last_token_idx):
        h = self.embed_tokens(input_ids) * self.normalizer
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.prefill(h, positions, out_cache_loc, kv)
        return F.linear(_rms(h[last_token_idx], self.final_norm), self.embed_tokens.weight).float()
