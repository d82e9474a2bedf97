"""A small decoder whose layers all share one attention backend object."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from ubr import ModelConfig
from ubr_backends.fi_paged import FlashInferPagedBackend
from ubr_backends.trtllm_gen import TrtllmGenBackend
from ubr_model.layers import MLP, AttentionLayer


class DecoderModel(nn.Module):
    def __init__(self, cfg: ModelConfig, backend: FlashInferPagedBackend | TrtllmGenBackend):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.pos_embed = nn.Embedding(cfg.max_pages_per_seq * cfg.page_size, cfg.hidden_size)
        self.attn_layers = nn.ModuleList([AttentionLayer(cfg, i, backend) for i in range(cfg.num_layers)])
        self.mlps = nn.ModuleList([MLP(cfg) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward_decode(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: List[torch.Tensor],
        valid: torch.Tensor,
    ) -> torch.Tensor:
        h = self.embed(input_ids) + self.pos_embed(positions)
        for attn, mlp, kv in zip(self.attn_layers, self.mlps, kv_caches):
            h = h + attn(h, kv, valid)
            h = h + mlp(h)
        return self.lm_head(self.norm(h))
