"""A Mistral/Gemma-2-shaped decoder: local sliding-window layers with a few global ones in between."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ringserve.attn.base import ForwardBatch
from ringserve.attn.flashinfer_ring import FlashInferRingBackend
from ringserve.config import RingConfig
from ringserve.ring.ring_cache import RingKVCache


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.to(torch.float32)[:, None, None] * inv
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], dim=-1).to(x.dtype)


class RingDecoderLayer(nn.Module):
    def __init__(self, cfg: RingConfig, layer_id: int, cache: RingKVCache, backend: FlashInferRingBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.is_global = layer_id in cfg.global_layers
        self.cache = cache
        self.backend = backend
        q, kv = cfg.num_q_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.splits = (q, kv, kv)
        self.qkv = nn.Linear(cfg.hidden_size, q + 2 * kv, bias=False)
        self.o_proj = nn.Linear(q, cfg.hidden_size, bias=False)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(self.ln1(h)).split(self.splits, dim=-1)
        q = apply_rope(q.view(-1, cfg.num_q_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = apply_rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        self.cache.write_decode(self.layer_id, k, v, out_loc)
        return q, k, v

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        gate, up = self.up(self.ln2(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._qkv(h, positions, out_loc)
        k_cache, v_cache = self.cache.layer(self.layer_id)
        return self._finish(h, self.backend.forward_decode(q, k_cache, v_cache, self.layer_id, self.is_global))

    def forward_decode_large(self, h: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q, _, _ = self._qkv(h, batch.positions_gpu, batch.out_loc_gpu)
        return self._finish(h, self.backend.forward_decode_large(q, self.layer_id, batch))

    def forward_extend(self, h: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions, out_loc)
        return self._finish(h, self.backend.forward_extend(q, k, v, self.layer_id))


class SlidingWindowLM(nn.Module):
    def __init__(self, cfg: RingConfig, cache: RingKVCache, backend: FlashInferRingBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([RingDecoderLayer(cfg, i, cache, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, out_loc)
        return self.lm_head(self.norm(h))

    def forward_decode_large(self, batch: ForwardBatch) -> torch.Tensor:
        h = self.embed(batch.input_ids_gpu)
        for layer in self.layers:
            h = layer.forward_decode_large(h, batch)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids, positions, out_loc, last_idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, positions, out_loc)
        return self.lm_head(self.norm(h.index_select(0, last_idx)))
