"""A Llama-shaped decoder whose attention goes through the NTK backend."""

import torch
from torch import nn

from ntkserve import NTKConfig
from ntkserve.rope_cache import apply_rope_q
from ntk_attn.backend import NTKAttentionBackend


class NTKDecoderLayer(nn.Module):
    def __init__(self, cfg: NTKConfig, layer_id: int, backend: NTKAttentionBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        q_size = cfg.num_qo_heads * cfg.head_dim
        kv_size = cfg.num_kv_heads * cfg.head_dim
        self.sizes = (q_size, kv_size, kv_size)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)

    def _split(self, h: torch.Tensor):
        q, k, v = self.qkv(self.norm(h)).split(self.sizes, dim=-1)
        c = self.cfg
        return q.view(-1, c.num_qo_heads, c.head_dim), k.view(-1, c.num_kv_heads, c.head_dim), v

    def forward_decode(self, h, positions, row_alpha, kv_cache, bs: int, num_long: int):
        # K is rotated (with the same per-row alpha) and appended by the cache writer kernel
        q, _, _ = self._split(h)
        q = apply_rope_q(q, positions, row_alpha, self.cfg.rope_theta, self.cfg.head_dim)
        o = self.backend.forward_decode(q, kv_cache[self.layer_id], bs, num_long)
        return h + self.o_proj(o.reshape(h.shape[0], -1))

    def forward_prefill(self, h, positions, kv_cache):
        q, k, _ = self._split(h)
        q, k = self.backend.rotate_prefill(q, k, positions)
        o = self.backend.forward_prefill(q, kv_cache[self.layer_id])
        return h + self.o_proj(o.reshape(h.shape[0], -1))


class NTKModel(nn.Module):
    def __init__(self, cfg: NTKConfig, backend: NTKAttentionBackend):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([NTKDecoderLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, tokens, positions, row_alpha, kv_cache, bs: int, num_long: int):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.forward_decode(h, positions, row_alpha, kv_cache, bs, num_long)
        return self.lm_head(self.norm(h))

    def forward_prefill(self, tokens, positions, kv_cache):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer.forward_prefill(h, positions, kv_cache)
        return self.lm_head(self.norm(h))
