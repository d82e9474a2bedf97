"""Llama whose attention calls the FlashInfer custom ops; the whole forward is torch.compile-able."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cpo_engine.config import EngineConfig
from cpo_engine.metadata import AttnStepMetadata
from cpo_engine.ops.attention_ops import decode_attention, extend_attention, kv_cache, write_kv_cache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (self.weight * xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.h, self.kvh, self.d = cfg.num_q_heads, cfg.kv_spec.num_kv_heads, cfg.kv_spec.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, md: AttnStepMetadata) -> torch.Tensor:
        q, k, v = self.qkv_proj(h).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = apply_rope(q.view(-1, self.h, self.d), cos, sin)
        k = apply_rope(k.view(-1, self.kvh, self.d), cos, sin)
        k_cache, v_cache = kv_cache(self.layer_id)
        write_kv_cache(k, v.view(-1, self.kvh, self.d), k_cache, v_cache, md.slot_mapping)
        out = torch.empty_like(q)
        if md.num_decode_tokens > 0:
            decode_attention(q, self.layer_id, md.num_decode_tokens, out)
        if md.num_prefill_tokens > 0:
            extend_attention(q, self.layer_id, md.num_decode_tokens, out)
        return self.o_proj(out.flatten(1))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size)
        self.self_attn = LlamaAttention(cfg, layer_id)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, md: AttnStepMetadata) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, md)
        gate, up = self.gate_up_proj(self.post_attention_layernorm(h)).chunk(2, dim=-1)
        return h + self.down_proj(F.silu(gate) * up)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        d = cfg.kv_spec.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.outer(torch.arange(cfg.max_model_len, dtype=torch.float32), inv_freq)
        self.register_buffer("cos_cache", freqs.cos().to(torch.bfloat16), persistent=False)
        self.register_buffer("sin_cache", freqs.sin().to(torch.bfloat16), persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, md: AttnStepMetadata) -> torch.Tensor:
        cos = self.cos_cache[positions].unsqueeze(1)
        sin = self.sin_cache[positions].unsqueeze(1)
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, cos, sin, md)
        return self.lm_head(self.norm(h))
