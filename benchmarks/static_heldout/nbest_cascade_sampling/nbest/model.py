"""A Llama-style decoder whose attention goes through CascadeBackend.

``forward_graph`` is what the suffix graphs capture, ``forward_cascade`` the eager decode of large batches,
``forward_prompt`` the prefill of new prompts (one row per group).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nbest.cascade import CascadeBackend
from nbest.config import NBestConfig


class NBestLayer(nn.Module):
    def __init__(self, cfg: NBestConfig, backend: CascadeBackend) -> None:
        super().__init__()
        self.cfg, self.backend = cfg, backend
        hd = cfg.head_dim
        self.sizes = [cfg.num_qo_heads * hd, cfg.num_kv_heads * hd, cfg.num_kv_heads * hd]
        self.qkv_proj = nn.Linear(cfg.hidden_size, sum(self.sizes), bias=False)
        self.o_proj = nn.Linear(self.sizes[0], cfg.hidden_size, bias=False)
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * 14336, bias=False)
        self.down_proj = nn.Linear(14336, cfg.hidden_size, bias=False)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size)

    def _q(self, h, out_cache_loc, kv_cache):
        q, k, v = self.qkv_proj(self.input_layernorm(h)).split(self.sizes, dim=-1)
        ps, nkv, hd = self.cfg.page_size, self.cfg.num_kv_heads, self.cfg.head_dim
        kv_cache[out_cache_loc // ps, 0, out_cache_loc % ps] = k.view(-1, nkv, hd)
        kv_cache[out_cache_loc // ps, 1, out_cache_loc % ps] = v.view(-1, nkv, hd)
        return q.view(-1, self.cfg.num_qo_heads, hd)

    def _out(self, h, o):
        h = h + self.o_proj(o.reshape(o.shape[0], -1))
        gate, up = self.gate_up_proj(self.post_attention_layernorm(h)).chunk(2, dim=-1)
        return h + self.down_proj(F.silu(gate) * up)

    def forward_graph(self, h, out_cache_loc, kv_cache):
        return self._out(h, self.backend.forward_graph(self._q(h, out_cache_loc, kv_cache), kv_cache))

    def forward_cascade(self, h, out_cache_loc, kv_cache):
        return self._out(h, self.backend.forward_cascade(self._q(h, out_cache_loc, kv_cache), kv_cache))

    def forward_prompt(self, h, out_cache_loc, kv_cache, meta):
        return self._out(h, self.backend.forward_prompt(self._q(h, out_cache_loc, kv_cache), kv_cache, meta))


class NBestModel(nn.Module):
    def __init__(self, cfg: NBestConfig, backend: CascadeBackend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(NBestLayer(cfg, backend) for _ in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def _logits(self, h):
        return self.lm_head(self.norm(h)).float()

    def forward_graph(self, input_ids, out_cache_loc, kv_caches):
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_graph(h, out_cache_loc, kv)
        return self._logits(h)

    def forward_cascade(self, input_ids, out_cache_loc, kv_caches):
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_cascade(h, out_cache_loc, kv)
        return self._logits(h)

    def forward_prompt(self, input_ids, out_cache_loc, kv_caches, meta):
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_prompt(h, out_cache_loc, kv, meta)
        return self._logits(h[meta.last_token_idx])
