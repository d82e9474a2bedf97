"""A small hybrid decoder: every `window_every`-th layer is full attention, the others use a sliding window."""
from __future__ import annotations

import torch
from torch import nn

from ..attention import FlashInferImpl
from ..cudagraph import get_forward_context


class Attention(nn.Module):
    def __init__(self, name: str, cfg, sliding_window=None) -> None:
        super().__init__()
        self.name, self.h, self.kvh = name, cfg.num_attention_heads, cfg.num_key_value_heads
        self.d = cfg.hidden_size // self.h
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.impl = FlashInferImpl(self.h, self.d, self.d**-0.5, self.kvh, sliding_window)
        self.kv_cache = torch.empty(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unflatten(-1, (-1, self.d)).split([self.h, self.kvh, self.kvh], dim=1)
        out = torch.empty_like(q)
        self.impl.forward(q, k, v, self.kv_cache, get_forward_context().attn_metadata[self.name], out)
        return out.flatten(1)


class HybridDecoder(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        windows = [None if i % cfg.window_every == 0 else cfg.sliding_window for i in range(cfg.num_hidden_layers)]
        self.layers = nn.ModuleList(Attention(f"layers.{i}", cfg, w) for i, w in enumerate(windows))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = hidden + layer(hidden)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
