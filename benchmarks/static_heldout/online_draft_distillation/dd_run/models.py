"""A one-layer draft (EAGLE-style, over the target's hidden states when training) and the target."""
from typing import List, Tuple

import torch
from torch import nn

from dd_attn.attention import DraftAttention, TargetAttention
from distill import DistillConfig


def _split_qkv(cfg: DistillConfig, qkv: torch.Tensor):
    q, k, v = qkv.split([cfg.num_qo_heads * cfg.head_dim] + [cfg.num_kv_heads * cfg.head_dim] * 2, dim=-1)
    return (q.view(-1, cfg.num_qo_heads, cfg.head_dim), k.view(-1, cfg.num_kv_heads, cfg.head_dim),
            v.view(-1, cfg.num_kv_heads, cfg.head_dim))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DistillConfig, attn: DraftAttention):
        super().__init__()
        self.cfg, self.attn = cfg, attn
        self.qkv = nn.Linear(cfg.hidden_size, (cfg.num_qo_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = _split_qkv(self.cfg, self.qkv(h))
        return h + self.o(self.attn.attend(q, k, v, kv_cache, bs).flatten(1))


class DraftLM(nn.Module):
    def __init__(self, cfg: DistillConfig, attn: DraftAttention):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DraftLayer(cfg, attn) for _ in range(cfg.draft_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def decode(self, ids: torch.Tensor, kv_caches: List[torch.Tensor], bs: int) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer(h, kv, bs)
        return self.lm_head(h)

    def train_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = hidden
        for layer in self.layers:
            h = layer(h, None, 0)
        return self.lm_head(h)


class TargetLayer(nn.Module):
    def __init__(self, cfg: DistillConfig, attn: TargetAttention):
        super().__init__()
        self.cfg, self.attn = cfg, attn
        self.q = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def verify(self, h: torch.Tensor, kv: torch.Tensor, bs: int) -> torch.Tensor:
        q = self.q(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        return h + self.o(self.attn.attend_verify(q, kv, bs).flatten(1))

    def prefill(self, h: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        q = self.q(h).view(-1, self.cfg.num_qo_heads, self.cfg.head_dim)
        return h + self.o(self.attn.attend_prompt(q, kv).flatten(1))


class TargetLM(nn.Module):
    def __init__(self, cfg: DistillConfig, attn: TargetAttention):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([TargetLayer(cfg, attn) for _ in range(cfg.target_layers)])
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def verify(self, last: torch.Tensor, draft: torch.Tensor, kv_caches: List[torch.Tensor], bs: int) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(torch.cat([last[:, None], draft], dim=1).flatten())
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.verify(h, kv, bs)
        k1 = self.cfg.num_draft_tokens + 1
        return self.lm_head(h).view(bs, k1, -1), h.view(bs, k1, -1)

    def prefill(self, ids: torch.Tensor, kv_caches: List[torch.Tensor]) -> torch.Tensor:
        h = self.embed(ids)
        for layer, kv in zip(self.layers, kv_caches):
            h = layer.prefill(h, kv)
        return self.lm_head(h)
