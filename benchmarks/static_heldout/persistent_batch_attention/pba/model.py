"""Decoder with alternating sliding-window and full-attention layers."""

from typing import List, Optional

import torch
from torch import nn

from pba.backend.holistic import HolisticAttnBackend
from pba.config import EngineConfig


class AttnLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: HolisticAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.sliding = layer_id % cfg.swa_every == 0
        q_dim = cfg.num_qo_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=True)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(h).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)

    def decode(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        o = self.backend.forward_decode(self.sliding, self._q(h), kv_cache, bs)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)

    def mixed(self, h: torch.Tensor, kv_cache: torch.Tensor, tail_h: Optional[torch.Tensor]) -> torch.Tensor:
        tail_q = None if tail_h is None else self._q(tail_h)
        o = self.backend.forward_mixed(self._q(h), kv_cache, tail_q)
        h = h + self.o_proj(o[: h.shape[0]].reshape(h.shape[0], -1))
        return h + self.mlp(h)


class MixedModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: HolisticAttnBackend, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AttnLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.decode(h, kv, bs)
        return self.lm_head(h)

    def mixed_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, logits_idx: torch.Tensor,
                      tail_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.embed(input_ids)
        tail_h = None if tail_ids is None else self.embed(tail_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer.mixed(h, kv, tail_h)
        return self.lm_head(h.index_select(0, logits_idx))
