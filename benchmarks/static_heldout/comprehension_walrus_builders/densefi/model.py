"""A Llama-shaped decoder and the sampler, both calling into the shared attention backend."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from densefi.attention import FlashInferBackend
from densefi.config import EngineConfig
from densefi.metadata import FlashInferMetadata

PLACEHOLDER_TOKEN_ID = -1


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope_cache(head_dim: int, max_pos: int, theta: float) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope(x: torch.Tensor, cos_sin: torch.Tensor) -> torch.Tensor:
    cos, sin = (t[:, None, :] for t in cos_sin.chunk(2, dim=-1))
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferBackend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.head_dim = cfg.head_dim
        self.sizes = (cfg.num_qo_heads * cfg.head_dim, *(2 * [cfg.num_kv_heads * cfg.head_dim]))
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.register_buffer("cos_sin", rope_cache(cfg.head_dim, cfg.max_model_len, cfg.rope_theta), persistent=False)

    def forward(self, h, positions, meta: FlashInferMetadata, kv_cache) -> torch.Tensor:
        q, k, v = (t.view(t.shape[0], -1, self.head_dim) for t in self.qkv_proj(h).split(self.sizes, dim=-1))
        cs = self.cos_sin[positions]
        q, k = (apply_rope(t, cs) for t in (q, k))
        out = self.backend.forward(self.layer_id, q, k, v, kv_cache, meta)
        return self.o_proj(out.reshape(out.shape[0], -1))


class MLP(nn.Module):
    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferBackend) -> None:
        super().__init__()
        self.input_norm, self.post_norm = (RMSNorm(cfg.hidden_size, cfg.rms_eps) for _ in range(2))
        self.attn = Attention(cfg, layer_id, backend)
        self.mlp = MLP(cfg)

    def forward(self, h, positions, meta: FlashInferMetadata, kv_cache) -> torch.Tensor:
        h = h + self.attn(self.input_norm(h), positions, meta, kv_cache)
        return h + self.mlp(self.post_norm(h))


class DenseModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, positions, meta: FlashInferMetadata, kv_caches) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(h, positions, meta, kv_cache)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_k_np: np.ndarray
    num_generated: torch.Tensor
    min_tokens: torch.Tensor
    all_greedy: bool
    min_tokens_active: bool


class Sampler(nn.Module):
    def __init__(self, vocab_size: int, eos_token_id: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id

    def forward(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        if meta.min_tokens_active:
            below = meta.num_generated < meta.min_tokens
            logits[below, self.eos_token_id] = float("-inf")  # ok: FC101
        if meta.all_greedy:
            return logits.argmax(dim=-1)
        t0, *other_t = torch.unique(meta.temperature)  # expect: FC101
        logits = logits.div_(meta.temperature[:, None] if other_t else t0)
        k0, *other_k = np.unique(meta.top_k_np)  # ok: FC101
        if other_k or 0 < k0 < self.vocab_size:
            kmax = int(meta.top_k_np.max()) if (meta.top_k_np > 0).all() else self.vocab_size
            top = logits.topk(kmax, dim=-1).values
            k = torch.where(meta.top_k > 0, meta.top_k, kmax).clamp(max=kmax)
            kth = top.gather(1, (k[:, None] - 1).long())
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        return torch.multinomial(probs, 1).squeeze(1)
