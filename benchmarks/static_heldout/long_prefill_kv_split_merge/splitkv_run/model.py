"""A Qwen-shaped decoder; attention is delegated to the split-KV backend."""

import flashinfer
import torch
from torch import nn

from splitkv import SplitConfig
from splitkv_attn.backend import SplitAttnBackend


class SplitLayer(nn.Module):
    def __init__(self, cfg: SplitConfig, layer_id: int, backend: SplitAttnBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.sizes = (q_size, kv_size, kv_size)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=True)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def _rotated_q(self, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        q, k, _ = self.qkv(self.norm(h)).split(self.sizes, dim=-1)
        c = self.cfg
        q = q.view(-1, c.num_qo_heads, c.head_dim)
        k = k.view(-1, c.num_kv_heads, c.head_dim)
        q, _ = flashinfer.apply_rope_pos_ids(q, k, positions)
        return q

    def decode(self, h, positions, kv_cache, bs: int):
        o = self.backend.decode_attend(self._rotated_q(h, positions), kv_cache[self.layer_id], bs)
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def decode_eager(self, h, positions, kv_cache):
        o = self.backend.decode_attend_eager(self._rotated_q(h, positions), kv_cache[self.layer_id])
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def prefill(self, h, positions, kv_cache):
        o = self.backend.prefill_attend(self._rotated_q(h, positions), kv_cache[self.layer_id])
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class SplitModel(nn.Module):
    def __init__(self, cfg: SplitConfig, backend: SplitAttnBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([SplitLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, tokens, positions, kv_cache, bs: int):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.decode(h, positions, kv_cache, bs)
        return self.lm_head(self.norm(h))

    def decode_eager(self, tokens, positions, kv_cache):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.decode_eager(h, positions, kv_cache)
        return self.lm_head(self.norm(h))

    def prefill(self, tokens, positions, kv_cache):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.prefill(h, positions, kv_cache)
        return self.lm_head(self.norm(h[-1:]))
