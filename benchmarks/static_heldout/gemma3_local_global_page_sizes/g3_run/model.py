"""Gemma-3 style decoder: five sliding-window layers per global layer, QK-norm, softcapped logits."""
from __future__ import annotations

from typing import Dict

import torch
from torch import nn

from g3engine import Gemma3Config, LayerKind, layer_kinds
from g3_attn.backend import LocalGlobalBackend


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = positions.float()[:, None, None] * inv
    x1, x2 = x[..., ::2].float(), x[..., 1::2].float()
    return torch.stack((x1 * ang.cos() - x2 * ang.sin(), x1 * ang.sin() + x2 * ang.cos()), -1).flatten(-2).to(x.dtype)


class Gemma3Attention(nn.Module):
    def __init__(self, cfg: Gemma3Config, kind: LayerKind, slot: int, backend: LocalGlobalBackend):
        super().__init__()
        self.kind, self.slot, self.backend = kind, slot, backend
        self.h, self.kvh, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.q_norm, self.k_norm = RMSNorm(self.d), RMSNorm(self.d)
        self.rope_base = cfg.rope_local_base if kind is LayerKind.LOCAL else cfg.rope_global_base

    def _project(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        n = h.shape[0]
        q, k, v = self.qkv(h).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=-1)
        q = self.q_norm(q.view(n, self.h, self.d))
        k = self.k_norm(k.view(n, self.kvh, self.d))
        self.backend.append_kv(self.kind, self.slot, apply_rope(k, positions, self.rope_base), v.view(n, self.kvh, self.d))
        return apply_rope(q, positions, self.rope_base)

    def forward_decode(self, h: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        q = self._project(h, positions)
        if self.kind is LayerKind.LOCAL:
            o = self.backend.decode_local(q, self.slot)
        else:
            o = self.backend.decode_global(q, self.slot, bs)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_extend(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q = self._project(h, positions)
        o = self.backend.extend(self.kind, q, self.slot)
        return self.o_proj(o.reshape(h.shape[0], -1))


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: Gemma3Config, kind: LayerKind, slot: int, backend: LocalGlobalBackend):
        super().__init__()
        self.attn = Gemma3Attention(cfg, kind, slot, backend)
        self.pre_attn, self.pre_mlp = RMSNorm(cfg.hidden_size), RMSNorm(cfg.hidden_size)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(self.pre_mlp(x)).chunk(2, dim=-1)
        return x + self.down(nn.functional.gelu(g, approximate="tanh") * u)

    def forward_decode(self, h, positions, bs):
        return self._mlp(h + self.attn.forward_decode(self.pre_attn(h), positions, bs))

    def forward_extend(self, h, positions):
        return self._mlp(h + self.attn.forward_extend(self.pre_attn(h), positions))


class Gemma3Decoder(nn.Module):
    def __init__(self, cfg: Gemma3Config, backend: LocalGlobalBackend):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        slots: Dict[LayerKind, int] = {LayerKind.LOCAL: 0, LayerKind.GLOBAL: 0}
        layers = []
        for kind in layer_kinds(cfg):
            layers.append(Gemma3Layer(cfg, kind, slots[kind], backend))
            slots[kind] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(cfg.hidden_size)
        self.normalizer = cfg.hidden_size ** 0.5

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.norm(h) @ self.embed.weight.t()
        cap = self.cfg.final_logit_softcap
        logits = cap * torch.tanh(logits.float() / cap)
        return torch.where(torch.isfinite(logits), logits, torch.full_like(logits, -cap))  # ok: FC101

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids) * self.normalizer
        for layer in self.layers:
            h = layer.forward_decode(h, positions, bs)
        if torch.isnan(h).any():  # expect: FC101
            raise FloatingPointError("NaN hidden state after the decode layers")
        return self._logits(h)

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids) * self.normalizer
        for layer in self.layers:
            h = layer.forward_extend(h, positions)
        return self._logits(h)
