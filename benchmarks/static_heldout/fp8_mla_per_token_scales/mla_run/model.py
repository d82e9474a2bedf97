"""DeepSeek-style MLA layers: decode runs in the latent with absorbed weights."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from mla_fp8 import AbsorbedWeights, LatentCache, MLAConfig, absorb_kv_b
from mla_attn.backend import FP8MLABackend


class MLAAttention(nn.Module):
    def __init__(self, cfg: MLAConfig, backend: FP8MLABackend, device: torch.device) -> None:
        super().__init__()
        self.cfg, self.backend = cfg, backend
        h, nope, rope = cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, h * (nope + rope), bias=False)
        self.kv_a_proj = nn.Linear(cfg.hidden_size, cfg.kv_lora_rank + rope, bias=False)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (nope + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, cfg.hidden_size, bias=False)
        # calibrated per-layer scale of the FP8 attention logits, loaded with the checkpoint
        self.k_scale = nn.Parameter(torch.ones((), device=device), requires_grad=False)
        self.k_scale_float = 1.0
        self.absorbed: Optional[AbsorbedWeights] = None

    def load_absorbed(self) -> None:
        c = self.cfg
        self.absorbed = absorb_kv_b(self.kv_b_proj.weight, c.num_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank)
        self.k_scale_float = float(self.k_scale)  # ok: FC101

    def _q(self, h: torch.Tensor):
        c = self.cfg
        q = self.q_proj(h).view(-1, c.num_heads, c.qk_nope_head_dim + c.qk_rope_head_dim)
        return q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)

    def forward_decode(self, h: torch.Tensor, slots: torch.Tensor, cache: LatentCache) -> torch.Tensor:
        q_nope, q_pe = self._q(h)
        q_lat = torch.einsum("thn,hnr->thr", q_nope, self.absorbed.w_uk)
        cache.write(slots, self.kv_a_proj(h))
        bmm1_scale = float(self.k_scale) * self.cfg.softmax_scale  # expect: FC101
        o_lat = self.backend.forward_decode(q_lat, q_pe, cache, bmm1_scale)
        return self.o_proj(torch.einsum("thr,hrv->thv", o_lat, self.absorbed.w_uv).flatten(1))

    def forward_prefill(self, h: torch.Tensor, slots: torch.Tensor, cache: LatentCache) -> torch.Tensor:
        c = self.cfg
        q_nope, q_pe = self._q(h)
        latent = self.kv_a_proj(h)
        cache.write(slots, latent)
        ckv, k_pe = latent.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(ckv).view(-1, c.num_heads, c.qk_nope_head_dim + c.v_head_dim)
        k_nope, v = kv.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.unsqueeze(1).expand(-1, c.num_heads, -1)], dim=-1)
        o = self.backend.forward_prefill(torch.cat([q_nope, q_pe], dim=-1), k, v)
        return self.o_proj(o.flatten(1))


class MLAModel(nn.Module):
    def __init__(self, cfg: MLAConfig, backend: FP8MLABackend, caches: List[LatentCache], device) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([MLAAttention(cfg, backend, device) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.caches = caches

    def load_absorbed(self) -> None:
        for layer in self.layers:
            layer.load_absorbed()

    def forward_decode(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, cache in zip(self.layers, self.caches):
            h = h + layer.forward_decode(h, slots, cache)
        return self.lm_head(h)

    def forward_prefill(self, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, cache in zip(self.layers, self.caches):
            h = h + layer.forward_prefill(h, slots, cache)
        return self.lm_head(h)
