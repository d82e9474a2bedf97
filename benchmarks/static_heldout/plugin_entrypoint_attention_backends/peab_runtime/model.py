"""Decoder whose layers take the attention plugin of their layer type."""
from __future__ import annotations

from typing import Dict, List

import torch
from torch import nn

from peab.batch import StepBatch
from peab.config import EngineConfig
from peab_plugins.base import AttentionBackend, KVCache


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, attn: AttentionBackend):
        super().__init__()
        self.cfg, self.layer_id, self.attn = cfg, layer_id, attn
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.split = [hidden, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]
        self.qkv_proj = nn.Linear(hidden, sum(self.split), bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.RMSNorm(hidden), nn.Linear(hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))

    def _qkv(self, h, rot, slot_ids, kv_cache: KVCache):
        c = self.cfg
        q, k, v = self.qkv_proj(h).split(self.split, dim=-1)
        q, k = q.view(-1, c.num_qo_heads, c.head_dim) * rot, k.view(-1, c.num_kv_heads, c.head_dim) * rot
        v = v.view(-1, c.num_kv_heads, c.head_dim)
        page, offset = slot_ids // c.page_size, slot_ids % c.page_size
        kv_cache[0][page, offset], kv_cache[1][page, offset] = k, v
        return q, k, v

    def forward_decode(self, h, rot, slot_ids, kv_cache: KVCache) -> torch.Tensor:
        q, _, _ = self._qkv(h, rot, slot_ids, kv_cache)
        h = h + self.o_proj(self.attn.forward_decode(q, kv_cache, self.layer_id).flatten(1))
        return h + self.mlp(h)

    def forward_extend(self, h, rot, slot_ids, kv_cache: KVCache) -> torch.Tensor:
        q, k, v = self._qkv(h, rot, slot_ids, kv_cache)
        h = h + self.o_proj(self.attn.forward_extend(q, k, v, kv_cache, self.layer_id).flatten(1))
        return h + self.mlp(h)


class Model(nn.Module):
    def __init__(self, cfg: EngineConfig, backends: Dict[str, AttentionBackend]):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        kinds = cfg.layer_types()
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i, backends[kinds[i]]) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        self.rope_len = cfg.max_model_len
        self.register_buffer("inv_freq", 1.0 / (5e5 ** (torch.arange(0, cfg.head_dim).float() / cfg.head_dim)))
        self.check_nan = False

    def forward_decode(self, input_ids, positions, slot_ids, kv_caches: List[KVCache]) -> torch.Tensor:
        if positions.max() >= self.rope_len:  # expect: FC101
            raise ValueError("decode position past the model's context length")
        h, rot = self.embed(input_ids), torch.cos(positions.float()[:, None, None] * self.inv_freq)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_decode(h, rot, slot_ids, kv)
        return self.norm(h)

    def forward_extend(self, batch: StepBatch, kv_caches: List[KVCache]) -> torch.Tensor:
        h, rot = self.embed(batch.input_ids), torch.cos(batch.positions.float()[:, None, None] * self.inv_freq)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.forward_extend(h, rot, batch.slot_ids, kv)
        if self.check_nan and torch.isnan(h).any():  # expect: FC101
            raise FloatingPointError("NaN in the prefill hidden states")
        return self.norm(h)
