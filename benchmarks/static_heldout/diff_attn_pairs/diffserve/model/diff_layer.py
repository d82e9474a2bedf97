"""Differential attention layers. ``diffserve.model`` is a namespace folder shared with the weight loaders."""

from __future__ import annotations

import torch
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace
from torch import nn

from diffserve.attention.backend import DiffAttnBackend
from diffserve.attention.metadata import DiffForwardBatch
from diffserve.config import DiffConfig
from diffserve.lambda_reparam import DiffLambda


def _rope_cache(max_pos: int, dim: int, theta: float, device) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    t = torch.arange(max_pos, dtype=torch.float32, device=device)
    freqs = torch.outer(t, inv)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


class DiffAttention(nn.Module):
    def __init__(self, cfg: DiffConfig, layer_id: int, backend: DiffAttnBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.anchor = cfg.is_anchor(layer_id)
        self.nhd = backend._kv_layout == "NHD"  # ok: FC103
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size = 2 * h * d
        self.k_size = 2 * kvh * d
        self.v_size = kvh * d
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + self.k_size + self.v_size, bias=False, device=device)
        self.o_proj = nn.Linear(2 * h * d, cfg.hidden_size, bias=False, device=device)
        self.lam = DiffLambda(d, layer_id, cfg.lambda_init_decay, device)
        self.subln_weight = nn.Parameter(torch.ones(d, device=device))
        self.register_buffer("cos_sin_cache", _rope_cache(cfg.max_context_len, d, cfg.rope_theta, device), persistent=False)

    def _project(self, h: torch.Tensor, fb: DiffForwardBatch):
        q, k, v = self.qkv_proj(h).split([self.q_size, self.k_size, self.v_size], dim=-1)
        apply_rope_with_cos_sin_cache_inplace(fb.positions, q, k, self.cfg.head_dim, self.cos_sin_cache, is_neox=True)
        n, hh, kvh, d = h.shape[0], self.cfg.num_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        q = q.view(n, 2, hh, d)
        k = k.view(n, 2, kvh, d)
        v = v.view(n, kvh, d)
        k_pos, k_neg = k.unbind(1)
        self.backend.pool.store(self.layer_id, k_pos, k_neg, v, fb.out_cache_loc)
        return q, k_pos, k_neg, v

    def _combine(self, a_pos: torch.Tensor, a_neg: torch.Tensor) -> torch.Tensor:
        lam = self.lam()
        o = torch.sub(a_pos, a_neg, alpha=float(lam))  # expect: FC101
        n = o.shape[0]
        o = rmsnorm(o.reshape(-1, self.cfg.head_dim), self.subln_weight, eps=1e-5)
        o = o.view(n, -1) * self.lam.output_scale
        # both softmax heads of a pair read the same normalised output
        return self.o_proj(torch.cat([o, o], dim=-1))

    def forward_decode(self, h: torch.Tensor, fb: DiffForwardBatch) -> torch.Tensor:
        q, _, _, _ = self._project(h, fb)
        if self.anchor:
            o = self.backend.forward_anchor(q.flatten(1, 2), self.layer_id, fb)
            return self.o_proj(o.flatten(1))
        a_pos, a_neg = self.backend.forward_decode(q[:, 0], q[:, 1], self.layer_id, fb)
        return self._combine(a_pos, a_neg)

    def forward_extend(self, h: torch.Tensor, fb: DiffForwardBatch) -> torch.Tensor:
        q, k_pos, k_neg, v = self._project(h, fb)
        a_pos, a_neg = self.backend.forward_extend(q[:, 0], q[:, 1], k_pos, k_neg, v, self.layer_id, fb)
        return self._combine(a_pos, a_neg)


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, inter: int, device):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * inter, bias=False, device=device)
        self.down = nn.Linear(inter, hidden, bias=False, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(g) * u)


class DiffDecoderLayer(nn.Module):
    def __init__(self, cfg: DiffConfig, layer_id: int, backend: DiffAttnBackend, device):
        super().__init__()
        self.attn = DiffAttention(cfg, layer_id, backend, device)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.hidden_size * 8 // 3, device)
        self.ln1 = nn.Parameter(torch.ones(cfg.hidden_size, device=device))
        self.ln2 = nn.Parameter(torch.ones(cfg.hidden_size, device=device))

    def forward_decode(self, h: torch.Tensor, fb: DiffForwardBatch) -> torch.Tensor:
        h = h + self.attn.forward_decode(rmsnorm(h, self.ln1), fb)
        return h + self.mlp(rmsnorm(h, self.ln2))

    def forward_extend(self, h: torch.Tensor, fb: DiffForwardBatch) -> torch.Tensor:
        h = h + self.attn.forward_extend(rmsnorm(h, self.ln1), fb)
        return h + self.mlp(rmsnorm(h, self.ln2))
