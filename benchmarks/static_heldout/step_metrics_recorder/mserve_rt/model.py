from __future__ import annotations

import flashinfer
import torch
from torch import nn

from mserve.attn import FlashInferBackend
from mserve.config import EngineConfig
from mserve.forward_batch import ForwardBatch


class Attention(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def _qkv(self, h: torch.Tensor, fb: ForwardBatch):
        q, k, v = self.qkv(h).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.cfg.num_heads, self.cfg.head_dim)
        k = k.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        v = v.view(-1, self.cfg.num_kv_heads, self.cfg.head_dim)
        flashinfer.apply_rope_pos_ids_inplace(q, k, fb.positions)
        cache = self.backend.pool.kv[self.layer_id].view(-1, 2, self.cfg.num_kv_heads, self.cfg.head_dim)
        cache[fb.out_cache_loc, 0] = k
        cache[fb.out_cache_loc, 1] = v
        return q

    def forward_decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        o = self.backend.forward_decode(self._qkv(h, fb), self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        o = self.backend.forward_extend(self._qkv(h, fb), self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1))


class Decoder(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([Attention(cfg, i, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(self, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = h + layer.forward_decode(h, fb)
        return self.lm_head(self.norm(h))

    def forward_extend(self, fb: ForwardBatch, last_rows: torch.Tensor) -> torch.Tensor:
        h = self.embed(fb.input_ids)
        for layer in self.layers:
            h = h + layer.forward_extend(h, fb)
        return self.lm_head(self.norm(h[last_rows]))
