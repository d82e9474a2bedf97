"""A mixture-of-depths decoder: dense blocks interleaved with routed blocks."""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn
from flashinfer.norm import rmsnorm
from flashinfer.page import append_paged_kv_cache

from modserve import _mod_ops  # the engine's compiled extension (gather/scatter of routed rows)
from modserve.attention import MoDAttnBackend
from modserve.config import MoDConfig
from modserve.routing.depth_router import DepthRouter


class BlockAttention(nn.Module):
    def __init__(self, cfg: MoDConfig, layer_id: int, backend: MoDAttnBackend, routed: bool):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.routed = routed
        qkv_out = (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, qkv_out, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, decode: bool) -> torch.Tensor:
        c = self.cfg
        q, k, v = self.qkv(h).split(
            [c.num_qo_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], dim=-1
        )
        q = q.view(-1, c.num_qo_heads, c.head_dim)
        if not decode:
            out = self.backend.prefill(q, k.view(-1, c.num_kv_heads, c.head_dim), v.view(-1, c.num_kv_heads, c.head_dim))
        elif self.routed:
            out = self.backend.decode_routed(q, kv_cache)
        else:
            out = self.backend.decode_dense(q, kv_cache)
        return self.o_proj(out.reshape(h.shape[0], -1))


class Block(nn.Module):
    def __init__(self, cfg: MoDConfig, layer_id: int, backend: MoDAttnBackend):
        super().__init__()
        self.routed = cfg.is_routed(layer_id)
        self.attn = BlockAttention(cfg, layer_id, backend, self.routed)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.SiLU(), nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))
        self.norm_w = nn.Parameter(torch.ones(cfg.hidden_size))
        self.eps = 1e-6

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, decode: bool) -> torch.Tensor:
        x = rmsnorm(h, self.norm_w, self.eps)
        h = h + self.attn(x, kv_cache, decode)
        return h + self.mlp(rmsnorm(h, self.norm_w, self.eps))


class MoDModel(nn.Module):
    def __init__(self, cfg: MoDConfig, backend: MoDAttnBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.router = DepthRouter(cfg, device)
        self.layers = nn.ModuleList([Block(cfg, i, backend) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.final_norm = nn.Parameter(torch.ones(cfg.hidden_size))

    def forward_decode(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], num_rows: int) -> torch.Tensor:
        h = self.embed(input_ids)
        keep = self.router.predict_keep(h, num_rows)
        for layer, kv in zip(self.layers, kv_caches):
            if layer.routed:
                # rows the predictor drops skip the block; the extension blends by the mask
                out = layer(h, kv, True)
                h = _mod_ops.masked_blend(h, out, keep, self.router.route_weight)
            else:
                h = layer(h, kv, True)
        return self.lm_head(rmsnorm(h, self.final_norm, 1e-6))

    def forward_prefill(self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], num_tokens: int) -> torch.Tensor:
        h = self.embed(input_ids)
        rows = self.router.select_rows(h, num_tokens)
        routed_h = h[rows]
        for layer, kv in zip(self.layers, kv_caches):
            if layer.routed:
                routed_h = layer(routed_h, kv, False)
            else:
                h = layer(h, kv, False)
        h = _mod_ops.scatter_rows(h, routed_h, rows)
        return self.lm_head(rmsnorm(h[-1:], self.final_norm, 1e-6))

    def append_kv(self, k, v, kv_cache, batch_indices, positions, kv_indices, kv_indptr, last_page_len):
        append_paged_kv_cache(k, v, batch_indices, positions, kv_cache, kv_indices, kv_indptr, last_page_len)
