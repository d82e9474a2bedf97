"""Decoder whose graph-captured and spill forwards read the staged device buffers."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from ringstage import RingConfig
from rs_attn.backend import StagedDecodeBackend

HIDDEN = 1024


def greedy_sample(logits: torch.Tensor, eos_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    next_ids = torch.argmax(logits, dim=-1)
    finished_rows = torch.nonzero(next_ids == eos_id).flatten()  # expect: FC101
    return next_ids, finished_rows


class StagedLayer(nn.Module):
    def __init__(self, cfg: RingConfig, backend: StagedDecodeBackend):
        super().__init__()
        self.cfg, self.backend = cfg, backend
        h, kv, d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.qkv = nn.Linear(HIDDEN, (h + 2 * kv) * d, bias=False)
        self.o_proj = nn.Linear(h * d, HIDDEN, bias=False)

    def _project(self, x: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        kv_width = c.num_kv_heads * c.head_dim
        q, k, v = self.qkv(x).split([c.num_qo_heads * c.head_dim, kv_width, kv_width], dim=-1)
        pages, offs = slot_mapping // c.page_size, slot_mapping % c.page_size
        kv_cache[pages, 0, offs] = k.view(-1, c.num_kv_heads, c.head_dim)
        kv_cache[pages, 1, offs] = v.view(-1, c.num_kv_heads, c.head_dim)
        return q.view(-1, c.num_qo_heads, c.head_dim)

    def forward_bucket(self, x: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q = self._project(x, kv_cache, self.backend.slot_mapping_dev[:bs])
        return x + self.o_proj(self.backend.forward_decode(q, kv_cache, bs).flatten(1))

    def forward_spill(self, x: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        q = self._project(x, kv_cache, slot_mapping)
        return x + self.o_proj(self.backend.forward_spill(q, kv_cache).flatten(1))


class StagedModel(nn.Module):
    def __init__(self, cfg: RingConfig, backend: StagedDecodeBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, HIDDEN)
        self.pos = nn.Embedding(cfg.max_model_len, HIDDEN)
        self.layers = nn.ModuleList([StagedLayer(cfg, backend) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(HIDDEN, cfg.vocab_size, bias=False)
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)]

    def forward_bucket(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int):
        x = self.embed(input_ids) + self.pos(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_bucket(x, kv, bs)
        return greedy_sample(self.lm_head(x), self.cfg.eos_id)

    def forward_spill(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor):
        x = self.embed(input_ids) + self.pos(positions)
        for layer, kv in zip(self.layers, self.kv_caches):
            x = layer.forward_spill(x, kv, slot_mapping)
        return greedy_sample(self.lm_head(x), self.cfg.eos_id)
