from __future__ import annotations

from typing import List

import torch
from torch import nn

from tr_attn.backend import TracedAttnBackend
from tr_attn.config import TraceEngineConfig


class TracedAttention(nn.Module):
    def __init__(self, cfg: TraceEngineConfig, backend: TracedAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False, dtype=torch.float16)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False, dtype=torch.float16)

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)

    def forward_decode(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.backend.forward_decode(self._q(h), kv_cache).flatten(1))

    def forward_prefill(self, h: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.o_proj(self.backend.forward_prefill(self._q(h), kv_cache).flatten(1))

    def forward_long(self, h: torch.Tensor, kv_cache: torch.Tensor, seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
        return self.o_proj(self.backend.forward_long(self._q(h), kv_cache, seq_lens, max_len).flatten(1))


class TracedLM(nn.Module):
    def __init__(self, cfg: TraceEngineConfig, backend: TracedAttnBackend, kv_caches: List[torch.Tensor]):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=torch.float16)
        self.layers = nn.ModuleList(TracedAttention(cfg, backend) for _ in range(cfg.num_layers))
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, dtype=torch.float16)
        self.kv_caches = kv_caches

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_decode(h, kv)
        return self.head(h)

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_prefill(h, kv)
        return self.head(h)

    def forward_long(self, input_ids: torch.Tensor, seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_long(h, kv, seq_lens, max_len)
        return self.head(h)
