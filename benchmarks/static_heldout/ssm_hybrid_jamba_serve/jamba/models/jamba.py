"""A Jamba-style decoder: Mamba layers with one attention layer per period, MoE MLPs."""
from __future__ import annotations

from typing import TYPE_CHECKING, List

import torch
import torch.nn as nn
import torch.nn.functional as F

from jamba.config import JambaConfig
from jamba.layers.hybrid_backend import HybridJambaBackend

if TYPE_CHECKING:
    from jamba.runner.forward_batch import ForwardBatch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class SparseMoE(nn.Module):
    def __init__(self, cfg: JambaConfig):
        super().__init__()
        self.router = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(cfg.num_experts, 2 * 4 * cfg.hidden_size, cfg.hidden_size))
        self.w2 = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, 4 * cfg.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = torch.topk(torch.softmax(self.router(x), dim=-1), k=2, dim=-1)
        out = torch.zeros_like(x)
        for k in range(2):
            w1 = self.w1[experts[:, k]]
            w2 = self.w2[experts[:, k]]
            gate, up = torch.bmm(w1, x.unsqueeze(-1)).squeeze(-1).chunk(2, dim=-1)
            out += weights[:, k : k + 1] * torch.bmm(w2, (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
        return out


class JambaAttentionLayer(nn.Module):
    def __init__(self, cfg: JambaConfig, layer_id: int, attn_idx: int, backend: HybridJambaBackend):
        super().__init__()
        self.layer_id = layer_id
        self.attn_idx = attn_idx
        self.backend = backend
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.norm = RMSNorm(cfg.hidden_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.moe = SparseMoE(cfg) if layer_id % 2 == 1 else None

    def _qkv(self, h: torch.Tensor):
        qkv = self.qkv_proj(self.norm(h))
        q, k, v = qkv.split(
            [self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim], dim=-1
        )
        return (
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
        )

    def forward_decode(self, h: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        attn = self.backend.attn_backend
        q, k, v = self._qkv(h)
        attn.kv_pool.set_kv_buffer(self.attn_idx, fb.out_cache_loc, k, v)
        o = attn.forward_decode(q, self.attn_idx, fb)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.moe(h) if self.moe is not None else h

    def forward_extend(self, h: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        attn = self.backend.attn_backend
        q, k, v = self._qkv(h)
        attn.kv_pool.set_kv_buffer(self.attn_idx, fb.out_cache_loc, k, v)
        o = attn.forward_extend(q, k, v, self.attn_idx)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.moe(h) if self.moe is not None else h


class JambaMambaLayer(nn.Module):
    def __init__(self, cfg: JambaConfig, layer_id: int, mamba_idx: int, backend: HybridJambaBackend):
        super().__init__()
        self.layer_id = layer_id
        self.mamba_idx = mamba_idx
        self.backend = backend
        d_inner = cfg.mamba_d_inner
        self.norm = RMSNorm(cfg.hidden_size)
        self.in_proj = nn.Linear(cfg.hidden_size, 2 * d_inner, bias=False)
        self.conv1d_weight = nn.Parameter(torch.empty(d_inner, cfg.mamba_d_conv))
        self.conv1d_bias = nn.Parameter(torch.zeros(d_inner))
        self.x_proj = nn.Linear(d_inner, cfg.mamba_dt_rank + 2 * cfg.mamba_d_state, bias=False)
        self.dt_proj = nn.Linear(cfg.mamba_dt_rank, d_inner, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(d_inner))
        self.A = nn.Parameter(-torch.ones(d_inner, cfg.mamba_d_state))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, cfg.hidden_size, bias=False)
        self.dt_rank = cfg.mamba_dt_rank
        self.d_state = cfg.mamba_d_state
        self.moe = SparseMoE(cfg) if layer_id % 2 == 1 else None

    def project_ssm(self, x: torch.Tensor):
        dt, B, C = self.x_proj(x).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        return self.dt_proj(dt), B, C

    def forward_decode(self, h: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        h = h + self.backend.mamba_backend.forward_decode(self.norm(h), self.mamba_idx, self)
        return h + self.moe(h) if self.moe is not None else h

    def forward_extend(self, h: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        h = h + self.backend.mamba_backend.forward_extend(self.norm(h), self.mamba_idx, self)
        return h + self.moe(h) if self.moe is not None else h


class JambaForCausalLM(nn.Module):
    def __init__(self, cfg: JambaConfig, backend: HybridJambaBackend):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layers: List[nn.Module] = []
        attn_idx = mamba_idx = 0
        for i in range(cfg.num_layers):
            if cfg.is_attention_layer(i):
                layers.append(JambaAttentionLayer(cfg, i, attn_idx, backend))
                attn_idx += 1
            else:
                layers.append(JambaMambaLayer(cfg, i, mamba_idx, backend))
                mamba_idx += 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: "ForwardBatch") -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.forward_extend(h, fb)
        return self.lm_head(self.norm(h))
