"""A Llama-style decoder whose attention layers reach the backend by method name."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import EngineConfig
from .forward_batch import ForwardBatch


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_pos: int, theta: float) -> None:
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        t = torch.arange(max_pos, dtype=torch.float32)
        freqs = torch.outer(t, inv)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)

        def rot(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x.float().chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

        return rot(q), rot(k)


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_size, kv_size = cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_model_len, cfg.rope_theta)
        self.backend = backend

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split(self.split, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        forward = getattr(self.backend, self.backend.FORWARD_METHODS[fb.mode])
        o = forward(self.layer_id, q, k, v, fb)
        return self.o_proj(o.reshape(-1, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: EngineConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size)
        self.self_attn = Attention(cfg, layer_id, backend)
        self.post_norm = RMSNorm(cfg.hidden_size)
        self.mlp = MLP(cfg)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.self_attn(positions, self.input_norm(h), fb)
        return h + self.mlp(self.post_norm(h))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, backend) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # per-tensor FP8 KV scale from the checkpoint (1.0 for bf16 caches)
        self.register_buffer("k_scale", torch.ones(1, dtype=torch.float32))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(positions, h, fb)
        return h

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()
