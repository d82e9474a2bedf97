"""A Llama decoder in the PyTorch flow: attention goes through the FlashInfer backend with the step's metadata."""
from __future__ import annotations

from typing import List

import torch
from torch import nn
from flashinfer.norm import rmsnorm
from flashinfer.rope import apply_rope_pos_ids_inplace

from ..attention_backend.fi_metadata import FlashInferAttentionMetadata
from ..attention_backend.flashinfer_backend import FlashInferBackend


class LlamaAttention(nn.Module):
    def __init__(self, cfg, layer_idx: int, backend: FlashInferBackend) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.split = (q_size, kv_size, kv_size)
        self.attn_backend = backend

    def forward(
        self, hidden: torch.Tensor, position_ids: torch.Tensor, kv_cache: torch.Tensor,
        meta: FlashInferAttentionMetadata,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split(self.split, dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        apply_rope_pos_ids_inplace(q, k, position_ids)
        out = self.attn_backend.run_attention(q, k, v, kv_cache, meta)
        return self.o_proj(out.reshape(-1, self.num_heads * self.head_dim))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx: int, backend: FlashInferBackend) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(cfg, layer_idx, backend)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.ln1 = nn.Parameter(torch.ones(cfg.hidden_size))
        self.ln2 = nn.Parameter(torch.ones(cfg.hidden_size))
        self.eps = cfg.rms_norm_eps

    def forward(self, hidden, position_ids, kv_cache, meta):
        h = hidden + self.self_attn(rmsnorm(hidden, self.ln1, self.eps), position_ids, kv_cache, meta)
        gate, up = self.gate_up(rmsnorm(h, self.ln2, self.eps)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(gate) * up)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg, backend: FlashInferBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size))
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.eps = cfg.rms_norm_eps

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, kv_caches: List[torch.Tensor],
        meta: FlashInferAttentionMetadata,
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(h, position_ids, kv_cache, meta)
        return self.lm_head(rmsnorm(h, self.norm, self.eps))
