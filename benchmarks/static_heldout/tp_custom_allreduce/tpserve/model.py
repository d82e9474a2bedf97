"""A Qwen2-style decoder sharded over tensor-parallel ranks (column-parallel QKV / up, row-parallel O / down)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tpserve.attention import ModelConfig, RankAttention
from tpserve.comm.custom_allreduce import tensor_model_parallel_all_reduce


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 1_000_000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    freqs = positions.float()[:, None, None] * theta ** (-torch.arange(half, device=x.device) / half)
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * freqs.cos() - x2 * freqs.sin(), x2 * freqs.cos() + x1 * freqs.sin()], -1).to(x.dtype)


class RowParallelLinear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tensor_model_parallel_all_reduce(F.linear(x, self.weight))


class TPDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, attn: RankAttention, tp_size: int) -> None:
        super().__init__()
        self.cfg, self.layer_id, self.attn = cfg, layer_id, attn
        hd = cfg.head_dim
        self.sizes = [attn.num_qo_heads * hd, attn.num_kv_heads * hd, attn.num_kv_heads * hd]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=True)
        self.o_proj = RowParallelLinear(self.sizes[0], cfg.hidden_size, bias=False)
        inter = 4 * cfg.hidden_size // tp_size
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * inter, bias=False)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, bias=False)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size)

    def forward(self, h, positions, out_cache_loc, kv_cache):
        q, k, v = self.qkv_proj(self.input_layernorm(h)).split(self.sizes, dim=-1)
        nkv, hd, ps = self.attn.num_kv_heads, self.cfg.head_dim, self.cfg.page_size
        q = apply_rope(q.view(-1, self.attn.num_qo_heads, hd), positions)
        kv_cache[out_cache_loc // ps, 0, out_cache_loc % ps] = apply_rope(k.view(-1, nkv, hd), positions)
        kv_cache[out_cache_loc // ps, 1, out_cache_loc % ps] = v.view(-1, nkv, hd)
        o = self.attn.forward_decode(q, kv_cache, self.layer_id)
        h = h + self.o_proj(o.reshape(o.shape[0], -1))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(h)).chunk(2, dim=-1)
        return h + self.down_proj(F.silu(gate) * up)


class TPModel(nn.Module):
    def __init__(self, cfg: ModelConfig, attn: RankAttention, tp_size: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(TPDecoderLayer(cfg, i, attn, tp_size) for i in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size)
        # vocab-parallel head: each rank computes its vocab shard, the worker gathers
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size // tp_size, bias=False)

    def forward(self, input_ids, positions, out_cache_loc, kv_caches):
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, positions, out_cache_loc, kv)
        return self.lm_head(self.norm(h)).float()
