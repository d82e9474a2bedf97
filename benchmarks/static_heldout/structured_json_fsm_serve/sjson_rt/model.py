"""A Llama-shaped decoder wired to StructuredAttention."""
from typing import List

import torch
from torch import nn
from flashinfer.page import append_paged_kv_cache

from sjson.config import ServerConfig
from sjson_rt.attention import StructuredAttention
from sjson_rt.kv_pool import PagedKVPool


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float = 500000.0) -> torch.Tensor:
    half = x.shape[-1] // 2
    freqs = torch.arange(half, device=x.device, dtype=torch.float32) / half
    angles = positions.float()[:, None] * (theta ** -freqs)[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ServerConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.num_q = cfg.num_qo_heads
        self.num_kv = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.SiLU(), nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def _qkv(self, h: torch.Tensor, positions: torch.Tensor):
        q, k, v = self.qkv(self.norm1(h)).split(
            [self.num_q * self.head_dim, self.num_kv * self.head_dim, self.num_kv * self.head_dim], dim=-1
        )
        q = apply_rope(q.view(-1, self.num_q, self.head_dim), positions)
        k = apply_rope(k.view(-1, self.num_kv, self.head_dim), positions)
        return q, k, v.view(-1, self.num_kv, self.head_dim)

    def decode(self, h: torch.Tensor, positions: torch.Tensor, attn: StructuredAttention, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        batch_indices = torch.arange(bs, dtype=torch.int32, device=h.device)
        append_paged_kv_cache(k, v, batch_indices, positions.int(), kv_cache, attn.kv_indices, attn.kv_indptr[: bs + 1], attn.kv_last_page_len[:bs])
        o = attn.decode(q, kv_cache, bs)
        h = h + self.o_proj(o.reshape(bs, -1))
        return h + self.mlp(self.norm2(h))

    def extend(self, h: torch.Tensor, positions: torch.Tensor, attn: StructuredAttention, kv_cache: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        o = attn.extend(q, kv_cache)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))

    def prefill(self, h: torch.Tensor, positions: torch.Tensor, attn: StructuredAttention) -> torch.Tensor:
        q, k, v = self._qkv(h, positions)
        o = attn.prefill(q, k, v)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(self.norm2(h))


class JsonLM(nn.Module):
    def __init__(self, cfg: ServerConfig, attn: StructuredAttention, pool: PagedKVPool):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.attn = attn
        self.pool = pool

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, self.pool.kv_data):
            h = layer.decode(h, positions, self.attn, kv_cache, bs)
        return self.lm_head(self.norm(h)).float()

    def forward_extend(self, input_ids: torch.Tensor, positions: torch.Tensor, last_rows: List[int]) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, self.pool.kv_data):
            h = layer.extend(h, positions, self.attn, kv_cache)
        return self.lm_head(self.norm(h[last_rows])).float()

    def forward_prefill(self, input_ids: torch.Tensor, positions: torch.Tensor, last_rows: List[int]) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.prefill(h, positions, self.attn)
        return self.lm_head(self.norm(h[last_rows])).float()
