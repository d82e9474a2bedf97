"""Decode model whose attention per layer kind is looked up in the backend's run table."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from attn.backend import FlashInferHookedBackend
from attn.trtllm_gen import TrtllmDraft
from hookserve.config import ServeConfig


class HookedModel(nn.Module):
    def __init__(self, cfg: ServeConfig, draft: TrtllmDraft, kv_caches: List[torch.Tensor], device: torch.device) -> None:
        super().__init__()
        self.cfg, self.draft_attn, self.kv_caches = cfg, draft, kv_caches
        width = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.q_projs = nn.ModuleList(nn.Linear(cfg.hidden, width, bias=False) for _ in range(len(cfg.layer_kinds) + 1))
        self.o_projs = nn.ModuleList(nn.Linear(width, cfg.hidden, bias=False) for _ in range(len(cfg.layer_kinds) + 1))
        self.lora_bias = nn.Parameter(torch.zeros(cfg.num_lora_slots + 1, cfg.hidden, device=device))
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.slot_table = torch.full((cfg.max_batch_size,), -1, dtype=torch.int64, device=device)  # written by LoraSlotHook

    def _q(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.q_projs[i](h).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)

    def forward(self, ids: torch.Tensor, backend: FlashInferHookedBackend) -> torch.Tensor:
        h = self.embed(ids) + self.lora_bias[self.slot_table[: ids.shape[0]] + 1]
        for i, kind in enumerate(self.cfg.layer_kinds):
            h = h + self.o_projs[i](backend.forward_decode(self._q(i, h), self.kv_caches[i], kind).flatten(1))
        mtp = self.draft_attn(self._q(-1, h), self.kv_caches[-1])
        return self.lm_head(h + self.o_projs[-1](mtp.flatten(1)))

    def draft_logits(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return self.lm_head(h + self.o_projs[-1](self.draft_attn(self._q(-1, h), self.kv_caches[-1]).flatten(1)))

    def forward_extend(self, ids: torch.Tensor, positions: torch.Tensor, backend: FlashInferHookedBackend) -> torch.Tensor:
        h = self.embed(ids)
        for i in range(len(self.cfg.layer_kinds)):
            h = h + self.o_projs[i](backend.forward_extend(self._q(i, h), self.kv_caches[i]).flatten(1))
        return self.lm_head(h)
