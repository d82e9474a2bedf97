from __future__ import annotations

import torch
from torch import nn

from cfgserve.attention.backend import PairAttnBackend
from cfgserve.batch import PairDecodeMeta, PrefillMeta
from cfgserve.config import GenConfig


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    f = pos.float()[:, None] * inv
    c, s = f.cos()[:, None], f.sin()[:, None]
    a, b = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([a * c - b * s, b * c + a * s], -1).to(x.dtype)


class PairAttention(nn.Module):
    def __init__(self, cfg: GenConfig, backend: PairAttnBackend, layer_id: int):
        super().__init__()
        m = cfg.model
        self.backend = backend
        self.layer_id = layer_id
        self.h, self.kvh, self.d, self.theta = m.num_heads, m.num_kv_heads, m.head_dim, m.rope_theta
        self.qkv = nn.Linear(m.hidden_size, (m.num_heads + 2 * m.num_kv_heads) * m.head_dim, bias=False)
        self.o = nn.Linear(m.num_heads * m.head_dim, m.hidden_size, bias=False)

    def _qkv(self, x, pos, slot_mapping):
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], -1)
        q = rope(q.view(-1, self.h, self.d), pos, self.theta)
        k = rope(k.view(-1, self.kvh, self.d), pos, self.theta)
        torch.ops.cfgserve_ext.write_kv(self.backend.kv_caches[self.layer_id], k, v.view(-1, self.kvh, self.d),
                                        slot_mapping)
        return q

    def forward_prefill(self, x, pos, meta: PrefillMeta):
        q = self._qkv(x, pos, meta.slot_mapping)
        return self.o(self.backend.forward_prefill(q, self.layer_id).flatten(1))

    def forward_decode(self, x, pos, meta: PairDecodeMeta):
        q = self._qkv(x, pos, meta.slot_mapping)
        return self.o(self.backend.forward_decode(q, self.layer_id, meta).flatten(1))


class Block(nn.Module):
    def __init__(self, cfg: GenConfig, backend: PairAttnBackend, layer_id: int):
        super().__init__()
        m = cfg.model
        self.ln1 = nn.RMSNorm(m.hidden_size)
        self.ln2 = nn.RMSNorm(m.hidden_size)
        self.attn = PairAttention(cfg, backend, layer_id)
        self.mlp = nn.Sequential(nn.Linear(m.hidden_size, 4 * m.hidden_size), nn.GELU(),
                                 nn.Linear(4 * m.hidden_size, m.hidden_size))

    def forward_prefill(self, x, pos, meta):
        x = x + self.attn.forward_prefill(self.ln1(x), pos, meta)
        return x + self.mlp(self.ln2(x))

    def forward_decode(self, x, pos, meta):
        x = x + self.attn.forward_decode(self.ln1(x), pos, meta)
        return x + self.mlp(self.ln2(x))


class ImageARModel(nn.Module):
    """Text prompt tokens and VQ image tokens share one decoder; the image head
    predicts the next VQ code."""

    def __init__(self, cfg: GenConfig, backend: PairAttnBackend):
        super().__init__()
        m = cfg.model
        self.text_embed = nn.Embedding(m.text_vocab_size, m.hidden_size)
        self.image_embed = nn.Embedding(m.image_vocab_size, m.hidden_size)
        self.blocks = nn.ModuleList([Block(cfg, backend, i) for i in range(m.num_layers)])
        self.norm = nn.RMSNorm(m.hidden_size)
        self.image_head = nn.Linear(m.hidden_size, m.image_vocab_size, bias=False)

    def prefill(self, input_ids, positions, meta: PrefillMeta):
        x = self.text_embed(input_ids)
        for blk in self.blocks:
            x = blk.forward_prefill(x, positions, meta)
        return self.norm(x)

    def decode(self, image_ids, positions, meta: PairDecodeMeta):
        x = self.image_embed(image_ids)
        for blk in self.blocks:
            x = blk.forward_decode(x, positions, meta)
        return self.norm(x)

    def image_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.image_head(hidden).float()
