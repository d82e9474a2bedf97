"""A small decoder whose attention goes through the FlashInfer backend."""
from __future__ import annotations

import torch
from torch import nn

from penaltyserve.attn.backend import DecodeAttnBackend
from penaltyserve.config import EngineConfig


class DecoderLayer(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: DecodeAttnBackend, layer_id: int) -> None:
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        kv = cfg.num_kv_heads * cfg.head_dim
        self.cfg = cfg
        self.layer_id = layer_id
        self.backend = backend
        self.qkv = nn.Linear(hidden, hidden + 2 * kv, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))
        self.kv_cache = torch.zeros(
            cfg.max_num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=cfg.device,
        )

    def _q(self, h: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        q = self.qkv(h)[:, : cfg.num_qo_heads * cfg.head_dim]
        return q.view(-1, cfg.num_qo_heads, cfg.head_dim)

    def forward(self, h: torch.Tensor, bucket: int) -> torch.Tensor:
        o = self.backend.forward_decode(self._q(h), self.kv_cache, bucket)
        h = h + self.o(o.flatten(1))
        return h + self.mlp(h)

    def forward_eager(self, h: torch.Tensor, bs: int, max_seq_len: int) -> torch.Tensor:
        o = self.backend.forward_eager_decode(self._q(h), self.kv_cache, bs, max_seq_len)
        h = h + self.o(o.flatten(1))
        return h + self.mlp(h)


class PenaltyLM(nn.Module):
    def __init__(self, cfg: EngineConfig, backend: DecodeAttnBackend) -> None:
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.layers = nn.ModuleList([DecoderLayer(cfg, backend, i) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, bucket: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, bucket)
        return self.lm_head(h)

    def forward_eager(self, input_ids: torch.Tensor, max_seq_len: int) -> torch.Tensor:
        h = self.embed(input_ids)
        bs = input_ids.shape[0]
        for layer in self.layers:
            h = layer.forward_eager(h, bs, max_seq_len)
        return self.lm_head(h)
