"""A small decoder LM whose attention goes through ``GraphAttnBackend``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gcap.config import GraphConfig
from gcap.static_io import BucketView
from gcap_attn.backend import GraphAttnBackend
from gcap_attn.metadata import DecodeMeta


class Block(nn.Module):
    def __init__(self, layer_id: int, cfg: GraphConfig, backend: GraphAttnBackend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.nq, self.nkv, self.d = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden)
        self.norm2 = nn.RMSNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, (self.nq + 2 * self.nkv) * self.d, bias=False)
        self.o = nn.Linear(self.nq * self.d, cfg.hidden, bias=False)
        self.up = nn.Linear(cfg.hidden, 4 * cfg.hidden, bias=False)
        self.down = nn.Linear(4 * cfg.hidden, cfg.hidden, bias=False)

    def _q(self, x: torch.Tensor, out_loc: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).split([self.nq * self.d, self.nkv * self.d, self.nkv * self.d], -1)
        self.backend.store_kv(self.layer_id, k.view(-1, self.nkv, self.d), v.view(-1, self.nkv, self.d), out_loc)
        return q.view(-1, self.nq, self.d)

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm2(x))))

    def decode(self, x: torch.Tensor, out_loc: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        o = self.backend.decode_attention(self._q(x, out_loc), self.layer_id, meta)
        return self._ffn(x + self.o(o.flatten(1)))

    def verify(self, x: torch.Tensor, out_loc: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        o = self.backend.verify_attention(self._q(x, out_loc), self.layer_id, meta)
        return self._ffn(x + self.o(o.flatten(1)))


class SmallLM(nn.Module):
    def __init__(self, cfg: GraphConfig, backend: GraphAttnBackend) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_pages_per_seq * cfg.page_size, cfg.hidden)
        self.blocks = nn.ModuleList([Block(i, cfg, backend) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward_decode(
        self, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor, meta: DecodeMeta
    ) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos(positions)
        for blk in self.blocks:
            h = blk.decode(h, out_loc, meta)
        return self.lm_head(self.norm(h))

    def forward_verify(self, view: BucketView, meta: DecodeMeta) -> torch.Tensor:
        h = self.embed(view.input_ids) + self.pos(view.positions)
        for blk in self.blocks:
            h = blk.verify(h, view.out_loc, meta)
        return self.norm(h)
