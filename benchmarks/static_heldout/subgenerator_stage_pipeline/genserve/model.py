"""A small decoder whose attention goes through the backend."""

from __future__ import annotations

import torch
from torch import nn

from .attention import AttentionBackend
from .batch import StepMeta
from .config import EngineConfig


class AttentionLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: EngineConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.cfg = cfg
        self.backend = backend
        q_dim = cfg.num_qo_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        self.norm = nn.RMSNorm(cfg.hidden_size)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(self.norm(h)).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def forward_decode(self, h: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        o = self.backend.attend_decode(self._q(h), self.layer_id, meta)
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def forward_prefill(self, h: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        o = self.backend.attend_prefill(self._q(h), self.layer_id, meta)
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class TinyDecoder(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([AttentionLayer(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        # rotary embedding is fused into the attention kernels' q/k; positions ride along for it
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_decode(h, meta)
        return self.lm_head(self.norm(h))

    def prefill_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: StepMeta) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.forward_prefill(h, meta)
        last = meta.qo_indptr[1:].long() - 1
        return self.lm_head(self.norm(h.index_select(0, last)))
