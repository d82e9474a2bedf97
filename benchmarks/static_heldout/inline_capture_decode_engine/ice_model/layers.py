"""Decoder blocks. Every attention module gets the engine's backend through its constructors."""
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ice import EngineConfig
from ice_attn.registry import AttentionBackend


class RMSNorm(nn.Module):
    def __init__(self, dim: int, device: torch.device, dtype: torch.dtype, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg: EngineConfig, device: torch.device):
        super().__init__()
        exponent = torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta**exponent)
        t = torch.arange(cfg.max_context_len, device=device, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos", freqs.cos(), persistent=False)
        self.register_buffer("sin", freqs.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        pos = torch.where(positions >= 0, positions, 0)  # ok: FC101
        cos = self.cos[pos][:, None, :]
        sin = self.sin[pos][:, None, :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: AttentionBackend, rotary: RotaryEmbedding, device):
        super().__init__()
        self.cfg = cfg
        self.windowed = layer_id % cfg.window_every == cfg.window_every - 1
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False, device=device, dtype=cfg.dtype)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False, device=device, dtype=cfg.dtype)
        self.kv_scale = nn.Parameter(torch.ones((), dtype=torch.float32, device=device), requires_grad=False)
        self.rotary = rotary
        self.backend = backend

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        cfg = self.cfg
        q, k, v = self.qkv_proj(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, cfg.num_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        q, k = self.rotary(positions, q, k)
        inv_scale = 1.0 / float(self.kv_scale)  # expect: FC101
        self.backend.write_kv((k * inv_scale).to(kv_cache.dtype), (v * inv_scale).to(kv_cache.dtype), kv_cache, bs)
        o = self.backend.forward_decode(q, kv_cache, bs, self.windowed)
        return self.o_proj(o.reshape(-1, self.q_size))


class MLP(nn.Module):
    def __init__(self, cfg: EngineConfig, device: torch.device):
        super().__init__()
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False, device=device, dtype=cfg.dtype)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False, device=device, dtype=cfg.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: AttentionBackend, rotary: RotaryEmbedding, device):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, device, cfg.dtype)
        self.attn = Attention(cfg, layer_id, backend, rotary, device)
        self.post_norm = RMSNorm(cfg.hidden_size, device, cfg.dtype)
        self.mlp = MLP(cfg, device)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        h = h + self.attn(self.input_norm(h), positions, kv_cache, bs)
        return h + self.mlp(self.post_norm(h))
