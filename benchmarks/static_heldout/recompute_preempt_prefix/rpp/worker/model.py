from __future__ import annotations

import torch
from torch import nn

from rpp.attn.backend import FlashInferImpl
from rpp.attn.metadata import FlashInferMetadata
from rpp.config import EngineConfig


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    f = positions.float()[:, None] * inv[None, :]
    cos, sin = f.cos()[:, None, :], f.sin()[:, None, :]
    x1, x2 = x[..., : d // 2].float(), x[..., d // 2:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_idx: int):
        super().__init__()
        m = cfg.model
        self.h, self.kvh, self.d, self.theta = m.num_q_heads, m.num_kv_heads, m.head_dim, m.rope_theta
        self.ln1 = nn.RMSNorm(m.hidden_size)
        self.ln2 = nn.RMSNorm(m.hidden_size)
        self.qkv_proj = nn.Linear(m.hidden_size, (m.num_q_heads + 2 * m.num_kv_heads) * m.head_dim, bias=False)
        self.o_proj = nn.Linear(m.num_q_heads * m.head_dim, m.hidden_size, bias=False)
        self.gate_up = nn.Linear(m.hidden_size, 2 * 14336, bias=False)
        self.down = nn.Linear(14336, m.hidden_size, bias=False)
        self.impl = FlashInferImpl(m.num_q_heads, m.head_dim, m.head_dim ** -0.5, m.num_kv_heads,
                                   cfg.cache.kv_cache_dtype, layer_idx)

    def _qkv(self, positions, h):
        q, k, v = self.qkv_proj(h).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = apply_rope(q.view(-1, self.h, self.d), positions, self.theta)
        k = apply_rope(k.view(-1, self.kvh, self.d), positions, self.theta)
        return q, k, v.view(-1, self.kvh, self.d)

    def _mlp(self, h):
        g, u = self.gate_up(h).chunk(2, dim=-1)
        return self.down(nn.functional.silu(g) * u)

    def forward(self, positions, h, kv_cache, attn_metadata: FlashInferMetadata):
        q, k, v = self._qkv(positions, self.ln1(h))
        out = self.impl.forward(q, k, v, kv_cache, attn_metadata, torch.empty_like(q))
        h = h + self.o_proj(out.flatten(1))
        return h + self._mlp(self.ln2(h))

    def decode(self, positions, h, kv_cache, attn_metadata: FlashInferMetadata):
        q, k, v = self._qkv(positions, self.ln1(h))
        out = self.impl.forward_decode(q, k, v, kv_cache, attn_metadata, torch.empty_like(q))
        h = h + self.o_proj(out.flatten(1))
        return h + self._mlp(self.ln2(h))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        m = cfg.model
        self.embed_tokens = nn.Embedding(m.vocab_size, m.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(m.num_layers)])
        self.norm = nn.RMSNorm(m.hidden_size)
        self.lm_head = nn.Linear(m.hidden_size, m.vocab_size, bias=False)

    def forward(self, input_ids, positions, kv_caches, attn_metadata):
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(positions, h, kv, attn_metadata)
        return self.norm(h)

    def decode_forward(self, input_ids, positions, kv_caches, attn_metadata):
        """Pure decode batches: the entry point recorded into the decode graphs."""
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.decode(positions, h, kv, attn_metadata)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
