"""A small Llama-shaped decoder with LongRoPE-style position scaling.

Registered by qualified name in ``qrserve.config.MODEL_REGISTRY``. Its attention layers build whatever impl class
the backend resolves (``attn_backend.get_impl_cls()``) and hand it the decode-kernel module the platform table
names; even layers use the sliding window when the config has one.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from qrserve.config import EngineConfig


def _rope_cache(max_pos: int, dim: int, base: float, scale: float = 1.0) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    t = torch.arange(max_pos, dtype=torch.float32) / scale
    freqs = torch.outer(t, inv_freq)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def apply_rope(x: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    cos, sin = cos_sin.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_idx: int, impl_cls: type, kernel_module: Optional[str]):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        sliding_window = cfg.sliding_window if layer_idx % 2 == 0 else None
        self.impl = impl_cls(
            num_heads=cfg.num_heads,
            head_size=cfg.head_dim,
            scale=cfg.head_dim**-0.5,
            num_kv_heads=cfg.num_kv_heads,
            sliding_window=sliding_window,
            logits_soft_cap=cfg.logits_soft_cap,
            kernel_module=kernel_module,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
        )
        self.kv_cache: torch.Tensor = torch.empty(0)  # bound by GPUModelRunner.initialize_kv_cache

    def forward(self, hidden: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor, attn_metadata: Any):
        qkv = self.qkv_proj(hidden)
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = apply_rope(q.view(-1, self.num_heads, self.head_dim), cos_sin, positions)
        k = apply_rope(k.view(-1, self.num_kv_heads, self.head_dim), cos_sin, positions)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        out = torch.empty_like(q)
        self.impl.forward(self, q, k, v, self.kv_cache, attn_metadata, out)
        return self.o_proj(out.view(-1, q_size))


class MLP(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_idx: int, impl_cls: type, kernel_module: Optional[str]):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size)
        self.self_attn = Attention(cfg, layer_idx, impl_cls, kernel_module)
        self.post_norm = RMSNorm(cfg.hidden_size)
        self.mlp = MLP(cfg)

    def forward(self, hidden, cos_sin, positions, attn_metadata):
        hidden = hidden + self.self_attn(self.input_norm(hidden), cos_sin, positions, attn_metadata)
        return hidden + self.mlp(self.post_norm(hidden))


class TinyLlamaForCausalLM(nn.Module):
    def __init__(self, cfg: EngineConfig, attn_backend: Any, table: dict[str, Optional[str]]):
        super().__init__()
        impl_cls = attn_backend.get_impl_cls()
        kernel_module = table.get("decode_kernel")
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(cfg, i, impl_cls, kernel_module) for i in range(cfg.num_layers)]
        )
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.original_max_position = cfg.original_max_position
        long_scale = cfg.max_model_len / cfg.original_max_position
        self.register_buffer(
            "cos_sin_cache", _rope_cache(cfg.max_model_len, cfg.head_dim, cfg.rope_theta), persistent=False
        )
        self.register_buffer(
            "long_cos_sin_cache",
            _rope_cache(cfg.max_model_len, cfg.head_dim, cfg.rope_theta, scale=long_scale),
            persistent=False,
        )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata: Any) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        # LongRoPE: once any sequence passes the original context, the whole batch uses the long factors
        if positions.max() >= self.original_max_position:  # expect: FC101
            cos_sin = self.long_cos_sin_cache
        else:
            cos_sin = self.cos_sin_cache
        for layer in self.layers:
            hidden = layer(hidden, cos_sin, positions, attn_metadata)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
