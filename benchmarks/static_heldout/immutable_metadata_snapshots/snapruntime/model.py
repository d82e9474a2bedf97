"""A small decoder whose attention layers call the FlashInfer backend with the step's metadata value."""

from __future__ import annotations

from typing import List, Optional

import torch
from torch import nn

from snapattn.flashinfer_backend import FlashInferBackend
from snapserve.config import EngineConfig
from snapserve.metadata import BlockTableView, DecodeMetadata, DraftMeta


class AttentionLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, layer_id: int, backend: FlashInferBackend):
        super().__init__()
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        hidden = cfg.num_qo_heads * cfg.head_dim
        kv = cfg.num_kv_heads * cfg.head_dim
        self.qkv = nn.Linear(hidden, hidden + 2 * kv, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.norm = nn.RMSNorm(hidden)

    def _split(self, h: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(self.norm(h)).split(
            [cfg.num_qo_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim], dim=-1
        )
        return (
            q.view(-1, cfg.num_qo_heads, cfg.head_dim),
            k.view(-1, cfg.num_kv_heads, cfg.head_dim),
            v.view(-1, cfg.num_kv_heads, cfg.head_dim),
        )

    def _store_decode_kv(self, k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, meta: DecodeMetadata) -> None:
        """Write the new token of each request into its last page (reads the metadata, never writes it)."""
        last_page = meta.kv_indices[(meta.kv_indptr[1:] - 1).long()].long()
        offset = (meta.kv_last_page_len - 1).long()
        kv_cache[last_page, 0, offset] = k.to(kv_cache.dtype)
        kv_cache[last_page, 1, offset] = v.to(kv_cache.dtype)

    def forward_decode(self, h: torch.Tensor, meta: DecodeMetadata, kv_cache: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(h)
        self._store_decode_kv(k, v, kv_cache, meta)
        o = self.backend.forward_decode(q, kv_cache, meta, self.layer_id)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_draft(self, h: torch.Tensor, draft: DraftMeta, kv_cache: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._split(h)
        o = self.backend.forward_draft(q, kv_cache, draft)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_overflow(self, h: torch.Tensor, view: BlockTableView, kv_cache: torch.Tensor) -> torch.Tensor:
        q, _, _ = self._split(h)
        o = self.backend.forward_decode_overflow(q, kv_cache, view)
        return self.o_proj(o.reshape(h.shape[0], -1))

    def forward_extend(self, h: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(h)
        o = self.backend.forward_extend(q, k, v, kv_cache)
        pages = torch.div(slot_mapping, self.cfg.page_size, rounding_mode="floor")
        offset = slot_mapping % self.cfg.page_size
        kv_cache[pages, 0, offset] = k.to(kv_cache.dtype)
        kv_cache[pages, 1, offset] = v.to(kv_cache.dtype)
        return self.o_proj(o.reshape(h.shape[0], -1))


class TinyModel(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: FlashInferBackend, device: torch.device):
        super().__init__()
        self.cfg = cfg
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([AttentionLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.draft_head: Optional[AttentionLayer] = AttentionLayer(cfg.for_draft(), 0, backend) if cfg.enable_draft else None
        self.final_norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)
        shape = (cfg.max_total_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv_caches: List[torch.Tensor] = [
            torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers)
        ]
        self.draft_kv = torch.zeros(shape, dtype=torch.bfloat16, device=device)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_decode(h, meta, kv)
        return self.final_norm(h)

    def draft(self, hidden: torch.Tensor, positions: torch.Tensor, draft: DraftMeta) -> torch.Tensor:
        if self.draft_head is None:
            return hidden
        return hidden + self.draft_head.forward_draft(hidden, draft, self.draft_kv)

    def decode_overflow(self, input_ids: torch.Tensor, positions: torch.Tensor, view: BlockTableView) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_overflow(h, view, kv)
        return self.final_norm(h)

    def extend(self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = h + layer.forward_extend(h, kv, slot_mapping)
        return self.final_norm(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
