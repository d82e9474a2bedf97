"""A Llama-shaped decoder with separate entry points for pure-decode and mixed (POD) steps."""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from podserve.attn.pod_backend import DecodeMetadata, MixedMetadata, PodAttnBackend
from podserve.config import PodConfig


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    inv = theta ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    ang = positions.float()[:, None, None] * inv
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()], dim=-1).to(x.dtype)


class PodLayer(nn.Module):
    def __init__(self, cfg: PodConfig, backend: PodAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        q_size, kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.splits = [q_size, kv_size, kv_size]
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.up = nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(self.norm1(h)).split(self.splits, dim=-1)
        q = apply_rope(q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim), positions)
        k = apply_rope(k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim), positions)
        return q, k, v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)

    def _finish(self, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(attn.flatten(1))
        return h + self.down(nn.functional.silu(self.up(self.norm2(h))))

    def decode(self, h, positions, kv_cache, meta: DecodeMetadata):
        q, k, v = self._qkv(h, positions)
        self.backend.store_kv(kv_cache, k, v, meta.slot_mapping)
        return self._finish(h, self.backend.forward_decode(q, kv_cache, meta))

    def mixed(self, h, positions, kv_cache, meta: MixedMetadata):
        q, k, v = self._qkv(h, positions)
        self.backend.store_kv(kv_cache, k, v, meta.slot_mapping)
        n_p = meta.chunk_len
        out_p, out_d = self.backend.forward_mixed(q[:n_p], q[n_p:], kv_cache, meta)
        return self._finish(h, torch.cat([out_p, out_d]))


class PodDecoder(nn.Module):
    def __init__(self, cfg: PodConfig, backend: PodAttnBackend, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([PodLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, positions, kv, meta)
        return self.lm_head(self.norm(h))

    def forward_mixed(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: MixedMetadata) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.mixed(h, positions, kv, meta)
        h = h[: meta.num_tokens_gpu]  # expect: FC101
        return self.lm_head(self.norm(h.index_select(0, meta.sample_indices)))
