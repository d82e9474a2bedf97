"""The MoE decoder with a multi-token-prediction head run in the same step."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn

from moemon import ExpertLoadRecorder, ExpertPlacement, MoEConfig
from mm_attn.attn_backend import AttnBackend
from mm_model.moe import AttnBlock, MoEBlock


class MTPHead(nn.Module):
    def __init__(self, cfg: MoEConfig, attn: AttnBackend):
        super().__init__()
        self.attn = attn
        self.h, self.d = cfg.num_qo_heads, cfg.head_dim
        self.proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, hidden: torch.Tensor, next_embed: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        x = self.proj(torch.cat([hidden, next_embed], dim=-1))
        q = self.q_proj(x).view(-1, self.h, self.d)
        return x + self.o_proj(self.attn.forward_mtp(q, kv_cache).reshape(x.shape[0], -1))


class MoEModel(nn.Module):
    def __init__(self, cfg: MoEConfig, attn: AttnBackend, recorder: ExpertLoadRecorder, placement: ExpertPlacement):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.attn_blocks = nn.ModuleList([AttnBlock(cfg, attn) for _ in range(cfg.num_layers)])
        self.moe_blocks = nn.ModuleList([MoEBlock(cfg, i, recorder, placement) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.mtp = MTPHead(cfg, attn)

    def expert_weights(self) -> List[List[nn.Parameter]]:
        return [blk.expert_params() for blk in self.moe_blocks]

    def prefill(self, input_ids: torch.Tensor, last_idx: torch.Tensor, kv_caches: List[torch.Tensor]) -> torch.Tensor:
        x = self.embed(input_ids)
        for attn, moe, kv in zip(self.attn_blocks, self.moe_blocks, kv_caches):
            x = moe(attn.prefill(x, kv))
        return self.lm_head(self.norm(x)[last_idx])

    def decode(
        self, input_ids: torch.Tensor, kv_caches: List[torch.Tensor], mtp_cache: torch.Tensor, bs: Optional[int]
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(input_ids)
        for attn, moe, kv in zip(self.attn_blocks, self.moe_blocks, kv_caches):
            x = moe(attn.decode(x, kv, bs))
        h = self.norm(x)
        logits = self.lm_head(h)
        draft_embed = self.embed(logits.argmax(dim=-1))
        mtp_logits = self.lm_head(self.norm(self.mtp(h, draft_embed, mtp_cache)))
        return logits, mtp_logits
