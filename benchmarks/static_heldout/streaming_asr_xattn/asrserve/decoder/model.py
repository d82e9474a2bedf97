"""The autoregressive decoder: self-attention over its own tokens, cross-attention over the encoder pages."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from flashinfer import merge_state

from asrserve.decoder.attention import DecoderAttnBackend
from asrserve.decoder.metadata import DecodeMetadata
from asrserve.settings import ASRSettings


class DecoderPagePool:
    """Self-attention KV pages of the hypotheses, and the cross-attention K/V of every encoder page."""

    def __init__(self, settings: ASRSettings, device: torch.device, dtype=torch.bfloat16):
        s = settings
        self.settings = s
        n_self = s.max_streams * s.max_self_pages_per_stream()
        n_enc = s.max_streams * s.max_enc_pages_per_stream()
        self.self_kv = [torch.zeros((n_self, 2, s.page_size, s.dec_heads, s.head_dim), dtype=dtype, device=device) for _ in range(s.dec_layers)]
        self.cross_kv = [torch.zeros((n_enc, 2, s.enc_page_size, s.dec_heads, s.head_dim), dtype=dtype, device=device) for _ in range(s.dec_layers)]
        # one staging page per stream for the lookahead frames of the chunk being encoded
        self.partial_kv = [torch.zeros((s.max_streams, 2, s.enc_page_size, s.dec_heads, s.head_dim), dtype=dtype, device=device) for _ in range(s.dec_layers)]
        self.table_np = np.arange(n_self, dtype=np.int32).reshape(s.max_streams, -1)
        self.partial_len_np = np.zeros(s.max_streams, dtype=np.int32)

    def store_self(self, layer: int, k: torch.Tensor, v: torch.Tensor, loc: torch.Tensor) -> None:
        flat = self.self_kv[layer].view(-1, 2, self.settings.page_size, self.settings.dec_heads, self.settings.head_dim)
        page, slot = loc // self.settings.page_size, loc % self.settings.page_size
        flat[page, 0, slot] = k
        flat[page, 1, slot] = v


class SelfAttention(nn.Module):
    def __init__(self, s: ASRSettings, layer_id: int, pool: DecoderPagePool):
        super().__init__()
        self.layer_id = layer_id
        self.pool = pool
        self.heads, self.head_dim = s.dec_heads, s.head_dim
        self.qkv = nn.Linear(s.dec_dim, 3 * s.dec_heads * s.head_dim)
        self.out = nn.Linear(s.dec_heads * s.head_dim, s.dec_dim)

    def forward(self, h: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        q, k, v = self.qkv(h).view(-1, 3, self.heads, self.head_dim).unbind(1)
        self.pool.store_self(self.layer_id, k, v, meta.self_out_loc)
        o = meta.self_wrapper.run(q, self.pool.self_kv[self.layer_id])  # ok: FC108
        return self.out(o.reshape(h.shape[0], -1))


class CrossAttention(nn.Module):
    def __init__(self, s: ASRSettings, layer_id: int, pool: DecoderPagePool, backend: DecoderAttnBackend):
        super().__init__()
        self.layer_id = layer_id
        self.pool = pool
        self.backend = backend
        self.heads, self.head_dim = s.dec_heads, s.head_dim
        self.q = nn.Linear(s.dec_dim, s.dec_heads * s.head_dim)
        self.kv = nn.Linear(s.enc_dim, 2 * s.dec_heads * s.head_dim)
        self.out = nn.Linear(s.dec_heads * s.head_dim, s.dec_dim)

    def project_encoder(self, enc: torch.Tensor, slots: torch.Tensor) -> None:
        """Write the K/V of newly encoded frames into their encoder pages (once per chunk)."""
        k, v = self.kv(enc).view(-1, 2, self.heads, self.head_dim).unbind(1)
        cache = self.pool.cross_kv[self.layer_id]
        page, slot = slots // cache.shape[2], slots % cache.shape[2]
        cache[page, 0, slot] = k.to(cache.dtype)
        cache[page, 1, slot] = v.to(cache.dtype)

    def forward(self, h: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        q = self.q(h).view(-1, self.heads, self.head_dim)
        o_full, lse_full = meta.cross_wrapper.run_return_lse(q, self.pool.cross_kv[self.layer_id])
        o_part, lse_part = self.backend.attend_partial(q, self.pool.partial_kv[self.layer_id])
        o, _ = merge_state(o_full, lse_full, o_part, lse_part)
        return self.out(o.reshape(h.shape[0], -1))


class DecoderBlock(nn.Module):
    def __init__(self, s: ASRSettings, layer_id: int, pool: DecoderPagePool, backend: DecoderAttnBackend):
        super().__init__()
        self.self_attn = SelfAttention(s, layer_id, pool)
        self.cross_attn = CrossAttention(s, layer_id, pool, backend)
        self.ffn = nn.Sequential(nn.Linear(s.dec_dim, 4 * s.dec_dim), nn.GELU(), nn.Linear(4 * s.dec_dim, s.dec_dim))
        self.ln = nn.ModuleList([nn.LayerNorm(s.dec_dim) for _ in range(3)])

    def forward(self, h: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        h = h + self.self_attn(self.ln[0](h), meta)
        h = h + self.cross_attn(self.ln[1](h), meta)
        return h + self.ffn(self.ln[2](h))


class StreamingDecoder(nn.Module):
    def __init__(self, s: ASRSettings, pool: DecoderPagePool, backend: DecoderAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(s.vocab_size, s.dec_dim)
        self.pos = nn.Embedding(s.max_decode_len, s.dec_dim)
        self.blocks = nn.ModuleList([DecoderBlock(s, i, pool, backend) for i in range(s.dec_layers)])
        self.norm = nn.LayerNorm(s.dec_dim)
        self.lm_head = nn.Linear(s.dec_dim, s.vocab_size, bias=False)

    def project_encoder(self, enc: torch.Tensor, slots: torch.Tensor) -> None:
        for blk in self.blocks:
            blk.cross_attn.project_encoder(enc, slots)

    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        h = self.embed(tokens) + self.pos(positions)
        for blk in self.blocks:
            h = blk(h, meta)
        return self.lm_head(self.norm(h))
