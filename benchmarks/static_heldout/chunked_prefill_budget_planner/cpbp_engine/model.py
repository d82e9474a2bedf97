"""A small decoder whose attention layers share one MixedBatchBackend."""

import torch
from torch import nn

from cpbp import PAGE_SIZE, SchedulerConfig
from cpbp_attn.backend import MixedAttnMetadata, MixedBatchBackend

HIDDEN = 1024


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    pages, offsets = slot_mapping // PAGE_SIZE, slot_mapping % PAGE_SIZE
    kv_cache[pages, 0, offsets] = k
    kv_cache[pages, 1, offsets] = v


class DecoderLayer(nn.Module):
    def __init__(self, cfg: SchedulerConfig, backend: MixedBatchBackend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        h, kv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(HIDDEN, (h + 2 * kv) * d, bias=False)
        self.o_proj = nn.Linear(h * d, HIDDEN, bias=False)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 4 * HIDDEN), nn.SiLU(), nn.Linear(4 * HIDDEN, HIDDEN))

    def _attn_inputs(self, x, kv_cache, slot_mapping):
        h, kv, d = self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim
        q, k, v = self.qkv(x).split([h * d, kv * d, kv * d], dim=-1)
        write_kv(kv_cache, k.view(-1, kv, d), v.view(-1, kv, d), slot_mapping)
        return q.view(-1, h, d)

    def forward_decode(self, x, kv_cache, slot_mapping, meta: MixedAttnMetadata) -> torch.Tensor:
        o = self.backend.forward_decode(self._attn_inputs(x, kv_cache, slot_mapping), kv_cache, meta)
        x = x + self.o_proj(o.reshape(o.shape[0], -1))
        return x + self.mlp(x)

    def forward_mixed(self, x, kv_cache, slot_mapping, meta: MixedAttnMetadata) -> torch.Tensor:
        o = self.backend.forward_mixed(self._attn_inputs(x, kv_cache, slot_mapping), kv_cache, meta)
        x = x + self.o_proj(o.reshape(o.shape[0], -1))
        return x + self.mlp(x)


class TinyModel(nn.Module):
    def __init__(self, cfg: SchedulerConfig, backend: MixedBatchBackend, device: torch.device):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, HIDDEN)
        self.pos_embed = nn.Embedding(cfg.max_model_len, HIDDEN)
        self.layers = nn.ModuleList([DecoderLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(HIDDEN, cfg.vocab_size, bias=False)
        shape = (cfg.num_pages, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def forward_decode(self, input_ids, positions, slot_mapping, meta: MixedAttnMetadata) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos_embed(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_decode(x, kv, slot_mapping, meta)
        return self.lm_head(x)

    def forward_mixed(self, input_ids, positions, slot_mapping, meta: MixedAttnMetadata) -> torch.Tensor:
        x = self.embed(input_ids) + self.pos_embed(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_mixed(x, kv, slot_mapping, meta)
        return self.lm_head(x)
