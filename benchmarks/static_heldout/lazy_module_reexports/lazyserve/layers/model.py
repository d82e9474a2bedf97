"""A Llama-shaped decoder whose attention is delegated to the engine's backend."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..batch import ForwardBatch
from ..config import EngineConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float):
    half = q.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, device=q.device, dtype=torch.float32) / half))
    freqs = positions.float().unsqueeze(-1) * inv_freq
    cos, sin = freqs.cos().unsqueeze(1), freqs.sin().unsqueeze(1)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    return rotate(q), rotate(k)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, attn_backend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attn_backend = attn_backend
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.rope_theta = cfg.rope_theta
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        qkv = self.qkv_proj(self.input_norm(h))
        q, k, v = qkv.split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nq, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        q, k = apply_rope(q, k, positions, self.rope_theta)
        if fb.forward_mode.is_decode():
            o = self.attn_backend.forward_decode(q, k, v, self.layer_id, fb)
        else:
            o = self.attn_backend.forward_extend(q, k, v, self.layer_id, fb)
        h = h + self.o_proj(o.reshape(-1, self.nq * self.hd))
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)


class DecoderModel(nn.Module):
    def __init__(self, cfg: EngineConfig, attn_backend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, attn_backend) for i in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, positions, fb)
        if not fb.forward_mode.is_decode():
            h = h[fb.last_token_index]
        return self.lm_head(self.norm(h))
