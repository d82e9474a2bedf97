from __future__ import annotations

import torch
from torch import nn


class LlamaAttention(nn.Module):
    def __init__(self, cfg, layer_id: int) -> None:
        super().__init__()
        self.layer_id, self.h, self.kvh, self.d = layer_id, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor, fb) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).unflatten(-1, (-1, self.d)).split([self.h, self.kvh, self.kvh], dim=1)
        return self.o_proj(fb.attn_backend.forward(q, k, v, self, fb).flatten(1))


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaAttention(cfg, i) for i in range(cfg.num_hidden_layers))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = hidden + layer(positions, hidden, fb)
        return self.lm_head(hidden)
