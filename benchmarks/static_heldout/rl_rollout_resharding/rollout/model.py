"""The policy model as the rollout engine runs it (a Qwen2-style decoder, weights loaded from the trainer)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rollout.attn import RolloutDecodeBackend
from rollout.config import RolloutConfig


class PolicyLayer(nn.Module):
    def __init__(self, cfg: RolloutConfig, backend: RolloutDecodeBackend) -> None:
        super().__init__()
        self.cfg, self.backend = cfg, backend
        hd, d = cfg.head_dim, cfg.hidden_size
        self.sizes = [cfg.num_qo_heads * hd, cfg.num_kv_heads * hd, cfg.num_kv_heads * hd]
        self.qkv = nn.Linear(d, sum(self.sizes), bias=True)
        self.o = nn.Linear(self.sizes[0], d, bias=False)
        self.gate_up = nn.Linear(d, 8 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)
        self.norm1 = nn.RMSNorm(d)
        self.norm2 = nn.RMSNorm(d)

    def _attn_in(self, h, positions, out_cache_loc, kv_cache):
        q, k, v = self.qkv(self.norm1(h)).split(self.sizes, dim=-1)
        q = q.view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        page, off = out_cache_loc // self.cfg.page_size, out_cache_loc % self.cfg.page_size
        kv_cache[page, 0, off] = k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        kv_cache[page, 1, off] = v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        return q

    def _attn_out(self, h, o):
        h = h + self.o(o.reshape(o.shape[0], -1))
        gate, up = self.gate_up(self.norm2(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def decode(self, h, positions, out_cache_loc, kv_cache):
        q = self._attn_in(h, positions, out_cache_loc, kv_cache)
        return self._attn_out(h, self.backend.forward_decode(q, kv_cache))

    def prefill(self, h, positions, out_cache_loc, kv_cache):
        q = self._attn_in(h, positions, out_cache_loc, kv_cache)
        return self._attn_out(h, self.backend.forward_prefill(q, kv_cache))

    def extend(self, h, positions, out_cache_loc, kv_cache):
        q = self._attn_in(h, positions, out_cache_loc, kv_cache)
        return self._attn_out(h, self.backend.forward_extend(q, kv_cache))


class PolicyModel(nn.Module):
    def __init__(self, cfg: RolloutConfig, backend: RolloutDecodeBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(PolicyLayer(cfg, backend) for _ in range(cfg.num_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, input_ids, positions, out_cache_loc, kv_cache):
        h = self.embed(input_ids)
        for layer, layer_kv in zip(self.layers, kv_cache):
            h = layer.decode(h, positions, out_cache_loc, layer_kv)
        return self.lm_head(self.norm(h)).float()

    def prefill(self, input_ids, positions, out_cache_loc, kv_cache, last_idx):
        h = self.embed(input_ids)
        for layer, layer_kv in zip(self.layers, kv_cache):
            h = layer.prefill(h, positions, out_cache_loc, layer_kv)
        return self.lm_head(self.norm(h[last_idx])).float()

    def extend(self, input_ids, positions, out_cache_loc, kv_cache):
        h = self.embed(input_ids)
        for layer, layer_kv in zip(self.layers, kv_cache):
            h = layer.extend(h, positions, out_cache_loc, layer_kv)
        return self.lm_head(self.norm(h)).float()
