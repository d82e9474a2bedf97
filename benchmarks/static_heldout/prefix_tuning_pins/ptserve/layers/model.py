"""Base model shared by every tenant; soft prompts only enter through attention."""
from __future__ import annotations

import torch
from torch import nn

from ptserve.model_executor.forward_batch import ForwardBatch
from ptserve.server_args import ModelConfig


class PTAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def _split(self, h: torch.Tensor):
        q, k, v = self.qkv_proj(h).split(
            [self.num_qo_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim], dim=-1
        )
        return (
            q.view(-1, self.num_qo_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
        )

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, _, _ = self._split(h)
        o = fb.attn_backend.forward_decode(q, self, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self._split(h)
        o = fb.attn_backend.forward_extend(q, k, v, self, fb)
        return self.o_proj(o.reshape(h.shape[0], -1))


class PTDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int):
        super().__init__()
        self.self_attn = PTAttention(cfg, layer_id)
        self.ln1 = nn.LayerNorm(cfg.hidden_size)
        self.ln2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.GELU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.self_attn.decode(self.ln1(h), fb)
        return h + self.mlp(self.ln2(h))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.self_attn.extend(self.ln1(h), fb)
        return h + self.mlp(self.ln2(h))


class PTModel(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([PTDecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        return self.lm_head(self.norm(h))
