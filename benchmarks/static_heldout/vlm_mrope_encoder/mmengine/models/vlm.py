"""A stand-in VLM decoder: M-RoPE self-attention layers plus Mllama-style cross-attention layers."""
from __future__ import annotations

import torch
from torch import nn


class MRotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, sections: tuple[int, int, int], base: float = 1e6) -> None:
        super().__init__()
        self.head_dim, self.sections, self.base = head_dim, sections, base
        self.cos_sin_cache = self._table(4096)

    def _table(self, n: int) -> torch.Tensor:
        inv = 1.0 / self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        freqs = torch.outer(torch.arange(n, dtype=torch.float32), inv)
        return torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    def ensure_cos_sin_cache(self, n: int) -> None:
        if n > self.cos_sin_cache.shape[0]:
            self.cos_sin_cache = self._table(n).to(self.cos_sin_cache.device)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        # each section of the rotary dims follows one axis (t, h, w) of the 3-D positions
        parts = [self.cos_sin_cache[positions[i]][..., : s] for i, s in enumerate(self.sections)]
        cos, sin = torch.cat(parts, dim=-1).chunk(2, dim=-1)
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos[:, None] - x2 * sin[:, None], x2 * cos[:, None] + x1 * sin[:, None]], -1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id: int) -> None:
        super().__init__()
        self.layer_id, self.is_cross_attention = layer_id, layer_id in cfg.cross_attention_layers
        self.h, self.kvh, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, rotary: MRotaryEmbedding, positions, hidden, fb) -> torch.Tensor:
        q, k, v = self.qkv(hidden).unflatten(-1, (-1, self.d)).split([self.h, self.kvh, self.kvh], dim=1)
        if not self.is_cross_attention:
            q, k = rotary(positions, q), rotary(positions, k)
        return hidden + self.o_proj(fb.attn_backend.forward(q, k, v, self, fb).flatten(1))


class VLMForCausalLM(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.rotary_emb = MRotaryEmbedding(cfg.head_dim, tuple(cfg.mrope_section))
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids, positions, fb, input_embeds=None) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        for layer in self.layers:
            hidden = layer(self.rotary_emb, positions, hidden, fb)
        return self.lm_head(hidden)
