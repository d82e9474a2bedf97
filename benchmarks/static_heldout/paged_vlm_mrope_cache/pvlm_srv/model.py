"""Qwen2-VL-shaped language model over the paged VLM attention."""
from __future__ import annotations

from typing import List

import torch
import torch.nn as nn

from pvlm.config import VLMConfig
from pvlm_srv.attention import KV, VLMAttention


class MRotary(nn.Module):
    """Rotary embedding whose frequency bands take the t / h / w position streams in turn."""

    def __init__(self, cfg: VLMConfig):
        super().__init__()
        half = cfg.head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half))
        freqs = torch.outer(torch.arange(cfg.max_model_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos_cache", freqs.cos(), persistent=False)
        self.register_buffer("sin_cache", freqs.sin(), persistent=False)
        self.section = list(cfg.mrope_section)

    def _select(self, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        per_stream = cache[positions]  # [3, n, half]
        bands = per_stream.split(self.section, dim=-1)
        return torch.cat([band[i % 3] for i, band in enumerate(bands)], dim=-1).unsqueeze(1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self._select(self.cos_cache, positions).to(x.dtype)
        sin = self._select(self.sin_cache, positions).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class VLMLayer(nn.Module):
    def __init__(self, cfg: VLMConfig, attn: VLMAttention, rope: MRotary):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.rope = rope
        hq, hkv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.split = (hq * d, hkv * d, hkv * d)
        self.input_norm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.split), bias=True)
        self.o_proj = nn.Linear(hq * d, cfg.hidden_size, bias=False)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 18944, bias=False), nn.SiLU(), nn.Linear(18944, cfg.hidden_size, bias=False))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, kv: KV, slots: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv_proj(self.input_norm(h)).split(self.split, dim=-1)
        q = self.rope(q.view(-1, c.num_qo_heads, c.head_dim), positions)
        k = self.rope(k.view(-1, c.num_kv_heads, c.head_dim), positions)
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        k_cache, v_cache = kv  # HND: [pages, heads, page_size, head_dim]
        pages, offs = slots // c.page_size, slots % c.page_size
        k_cache[pages, :, offs] = k
        v_cache[pages, :, offs] = v
        return q

    def forward_decode(self, h, positions, kv: KV, img_kv: KV, slots, bs: int) -> torch.Tensor:
        q = self._qkv(h, positions, kv, slots)
        o = self.attn.forward_decode(q, kv, img_kv, bs)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.post_norm(h))

    def forward_prefill(self, h, positions, kv: KV, img_kv: KV, slots) -> torch.Tensor:
        q = self._qkv(h, positions, kv, slots)
        o = self.attn.forward_prefill(q, kv, img_kv)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.post_norm(h))


class VLMDecoder(nn.Module):
    def __init__(self, cfg: VLMConfig, attn: VLMAttention):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rope = MRotary(cfg)
        self.layers = nn.ModuleList([VLMLayer(cfg, attn, self.rope) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-6)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches: List[KV] = []
        self.img_kv_caches: List[KV] = []

    def allocate_kv(self, device: torch.device) -> None:
        c = self.cfg
        for _ in range(c.num_layers):
            for pool, pages in ((self.kv_caches, c.num_pages), (self.img_kv_caches, c.num_image_pages)):
                k = torch.zeros(pages, c.num_kv_heads, c.page_size, c.head_dim, dtype=c.dtype, device=device)
                pool.append((k, torch.zeros_like(k)))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def decode(self, input_ids, positions, slots, bs: int) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer, kv, img_kv in zip(self.layers, self.kv_caches, self.img_kv_caches):
            h = layer.forward_decode(h, positions, kv, img_kv, slots, bs)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, embeds, positions, slots, last_token_idx) -> torch.Tensor:
        h = embeds
        for layer, kv, img_kv in zip(self.layers, self.kv_caches, self.img_kv_caches):
            h = layer.forward_prefill(h, positions, kv, img_kv, slots)
        return self.lm_head(self.norm(h.index_select(0, last_token_idx)))
