"""A Llama-style decoder whose attention goes through the wrappers of an ``AttnContext``."""

from __future__ import annotations

import math
from typing import List

import torch
from torch import nn
from flashinfer.rope import apply_rope_pos_ids_inplace

from protoserve.attention.context import AttnContext
from protoserve.config import EngineConfig


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_qo_heads = cfg.num_qo_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.split = [q_size, kv_size, kv_size]
        self.input_norm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.post_norm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * 4 * cfg.hidden_size, bias=False)
        self.down = nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False)

    def _attend(self, q: torch.Tensor, kv_cache: torch.Tensor, attn: AttnContext) -> torch.Tensor:
        if attn.is_extend:
            return attn.prefill_wrapper.run(q, kv_cache)  # ok: FC108
        if attn.verify_wrapper is not None:
            return attn.verify_wrapper.run(q, kv_cache)  # expect: FC108
        if attn.cascade_wrapper is not None:
            return attn.cascade_wrapper.run(q, kv_cache)  # expect: FC108
        if attn.trtllm is not None:
            return attn.trtllm.run_decode(q, kv_cache, attn.meta)
        return attn.decode_wrapper.run(q, kv_cache)  # ok: FC108

    def forward(
        self,
        h: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        attn: AttnContext,
    ) -> torch.Tensor:
        residual = h
        x = self.input_norm(h)
        q, k, v = self.qkv_proj(x).split(self.split, dim=-1)
        q = q.reshape(-1, self.num_qo_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        apply_rope_pos_ids_inplace(q, k, positions)
        # k/v of this step were appended by the fused qkv kernel upstream; attend over the cache
        o = self._attend(q, kv_cache, attn)
        h = residual + self.o_proj(o.reshape(o.shape[0], -1))
        gate, up = self.gate_up(self.post_norm(h)).chunk(2, dim=-1)
        return h + self.down(nn.functional.silu(gate) * up)


class TinyDecoder(nn.Module):
    def __init__(self, cfg: EngineConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=1e-5)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.logit_scale = 1.0 / math.sqrt(cfg.hidden_size / 4096)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: List[torch.Tensor],
        attn: AttnContext,
    ) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(h, positions, kv_cache, attn)
        return self.lm_head(self.norm(h)) * self.logit_scale
