"""Language model of the VLM; image tokens arrive as embeddings, text tokens as ids."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from vl_model.attention import VLAttentionBackend
from vl_model.config import VLConfig


def _mrope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Multimodal rope: the head dim is split in three sections rotated by (t, h, w) positions."""
    half = x.shape[-1] // 2
    inv = 1.0 / (theta ** (torch.arange(0, half, device=x.device, dtype=torch.float32) / half))
    sec = [half // 4, half * 3 // 8, half - half // 4 - half * 3 // 8]
    ang = torch.cat([positions[i].float()[:, None] * part[None, :] for i, part in enumerate(inv.split(sec))], dim=-1)
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x[..., :half].float(), x[..., half:].float()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


class VLAttention(nn.Module):
    def __init__(self, cfg: VLConfig, layer_id: int, backend: VLAttentionBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size, self.kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=True)
        self.o = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = _mrope(q.view(-1, cfg.num_qo_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = _mrope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        return q, k, v.view(-1, cfg.num_kv_heads, cfg.head_dim)

    @staticmethod
    def _store(kv_cache, k, v, slot_pages, slot_offsets):
        kv_cache[slot_pages, 0, :, slot_offsets] = k
        kv_cache[slot_pages, 1, :, slot_offsets] = v

    def extend(self, x, positions, kv_cache, slot_pages, slot_offsets):
        q, k, v = self._qkv(x, positions)
        self._store(kv_cache, k, v, slot_pages, slot_offsets)
        return self.o(self.backend.forward_extend(q, k, v, kv_cache).reshape(x.shape[0], -1))

    def decode(self, x, positions, kv_cache, slot_pages, slot_offsets):
        q, k, v = self._qkv(x, positions)
        self._store(kv_cache, k, v, slot_pages, slot_offsets)
        return self.o(self.backend.forward_decode(q, kv_cache).reshape(x.shape[0], -1))


class VLDecoderLayer(nn.Module):
    def __init__(self, cfg: VLConfig, layer_id: int, backend: VLAttentionBackend):
        super().__init__()
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.attn = VLAttention(cfg, layer_id, backend)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _mlp(self, x):
        g, u = self.gate_up(self.ln2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)

    def extend(self, x, positions, kv_cache, slot_pages, slot_offsets):
        return self._mlp(x + self.attn.extend(self.ln1(x), positions, kv_cache, slot_pages, slot_offsets))

    def decode(self, x, positions, kv_cache, slot_pages, slot_offsets):
        return self._mlp(x + self.attn.decode(self.ln1(x), positions, kv_cache, slot_pages, slot_offsets))


class VLModel(nn.Module):
    def __init__(self, cfg: VLConfig, backend: VLAttentionBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([VLDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_cache = torch.zeros(cfg.num_layers, cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size,
                                    cfg.head_dim, dtype=cfg.dtype, device=device)

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_pages: torch.Tensor,
                       slot_offsets: torch.Tensor, embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.embed(input_ids) if embeds is None else embeds
        for i, layer in enumerate(self.layers):
            x = layer.extend(x, positions, self.kv_cache[i], slot_pages, slot_offsets)
        return self.lm_head(self.norm(x))

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, rope_deltas: torch.Tensor,
                       slot_pages: torch.Tensor, slot_offsets: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        pos = positions + rope_deltas
        for i, layer in enumerate(self.layers):
            x = layer.decode(x, pos, self.kv_cache[i], slot_pages, slot_offsets)
        return self.lm_head(self.norm(x))
