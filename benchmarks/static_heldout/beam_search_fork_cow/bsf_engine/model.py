"""A Llama-shaped decoder with a prompt entry point and a beam-step entry point."""
from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn as nn
from flashinfer.rope import apply_rope_pos_ids

from bsf.config import BeamConfig
from bsf_engine.attention import BeamDecodeAttention


class BeamLayer(nn.Module):
    def __init__(self, cfg: BeamConfig):
        super().__init__()
        self.cfg = cfg
        self.sizes = [cfg.num_qo_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2
        hidden = self.sizes[0]
        self.norm = nn.RMSNorm(hidden)
        self.qkv = nn.Linear(hidden, sum(self.sizes), bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden, bias=False), nn.SiLU(), nn.Linear(4 * hidden, hidden, bias=False))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.cfg
        q, k, v = self.qkv(self.norm(h)).split(self.sizes, dim=-1)
        q, k = apply_rope_pos_ids(q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), positions)
        return q, k, v.view(-1, c.num_kv_heads, c.head_dim)

    def _finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(o.shape[0], -1))
        return h + self.mlp(self.norm(h))

    def prompt(self, h: torch.Tensor, positions: torch.Tensor, attn: BeamDecodeAttention, kv: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        attn.store_kv(k, v, kv)
        return self._finish(h, attn.forward_prompt(q, kv))

    def beams(self, h: torch.Tensor, positions: torch.Tensor, attn: BeamDecodeAttention, kv: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        attn.store_kv(k, v, kv)
        return self._finish(h, attn.forward_beams(q, kv))


class BeamLM(nn.Module):
    def __init__(self, cfg: BeamConfig):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([BeamLayer(cfg) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward_prompt(self, ids: torch.Tensor, positions: torch.Tensor, attn: BeamDecodeAttention,
                       kv_cache: List[torch.Tensor], last_idx: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_cache):
            h = layer.prompt(h, positions, attn, kv)
        return self.lm_head(h.index_select(0, last_idx)).float().log_softmax(-1)

    def forward_beams(self, ids: torch.Tensor, positions: torch.Tensor, attn: BeamDecodeAttention,
                      kv_cache: List[torch.Tensor]) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_cache):
            h = layer.beams(h, positions, attn, kv)
        return self.lm_head(h).float().log_softmax(-1)
