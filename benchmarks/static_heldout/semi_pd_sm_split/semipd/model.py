"""Building blocks of the served model; the workers own the layer loops (attention differs per worker)."""

from __future__ import annotations

from typing import Tuple

import torch
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace
from torch import nn

from semipd.config import SemiPDConfig


class SPDLayer(nn.Module):
    def __init__(self, cfg: SemiPDConfig, layer_id: int, device, dtype):
        super().__init__()
        self.layer_id = layer_id
        self.window = cfg.window if layer_id % 2 else 0
        self.cfg = cfg
        h, kv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.sizes = (h * d, kv * d, kv * d)
        self.qkv = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=False, device=device, dtype=dtype)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False, device=device, dtype=dtype)
        inter = cfg.hidden_size * 3
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * inter, bias=False, device=device, dtype=dtype)
        self.down = nn.Linear(inter, cfg.hidden_size, bias=False, device=device, dtype=dtype)
        self.ln1 = nn.Parameter(torch.ones(cfg.hidden_size, device=device, dtype=dtype))
        self.ln2 = nn.Parameter(torch.ones(cfg.hidden_size, device=device, dtype=dtype))

    def pre_attn(self, h: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(rmsnorm(h, self.ln1)).split(self.sizes, dim=-1)
        apply_rope_with_cos_sin_cache_inplace(positions, q, k, self.cfg.head_dim, cos_sin, is_neox=True)
        n, d = h.shape[0], self.cfg.head_dim
        return q.view(n, -1, d), k.view(n, -1, d), v.view(n, -1, d)

    def post_attn(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        g, u = self.gate_up(rmsnorm(h, self.ln2)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(g) * u)


class SPDModel(nn.Module):
    def __init__(self, cfg: SemiPDConfig, device, dtype=torch.bfloat16):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList([SPDLayer(cfg, i, device, dtype) for i in range(cfg.num_layers)])
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size, device=device, dtype=dtype))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, device=device, dtype=dtype)
        d = cfg.head_dim
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
        f = torch.outer(torch.arange(cfg.max_context_len, dtype=torch.float32, device=device), inv)
        self.register_buffer("cos_sin", torch.cat([f.cos(), f.sin()], dim=-1), persistent=False)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(rmsnorm(h, self.norm))
