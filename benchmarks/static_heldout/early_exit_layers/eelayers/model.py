"""Decoder split into layer groups; the confidence head runs after each group."""

from typing import List, Optional, Tuple

import torch
from torch import nn

from eelayers.attn.groups import LayerGroupAttention
from eelayers.confidence import ConfidenceHead
from eelayers.config import ExitConfig


class Layer(nn.Module):
    def __init__(self, cfg: ExitConfig):
        super().__init__()
        self.cfg = cfg
        q_dim = cfg.num_qo_heads * cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=False)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.GELU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def q(self, h: torch.Tensor) -> torch.Tensor:
        return self.q_proj(self.norm(h)).view(h.shape[0], self.cfg.num_qo_heads, self.cfg.head_dim)

    def out(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class GroupBlock(nn.Module):
    def __init__(self, cfg: ExitConfig, g: int, attn: LayerGroupAttention):
        super().__init__()
        self.g = g
        self.attn = attn
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg.layers_per_group)])

    def forward(self, h: torch.Tensor, kv_caches: List[torch.Tensor], graph_bs: Optional[int]) -> torch.Tensor:
        for layer, kv in zip(self.layers, kv_caches):
            o = self.attn.forward_group(self.g, layer.q(h), kv, graph_bs)
            h = layer.out(h, o)
        return h

    def backfill_kv(self, h: torch.Tensor, kv_caches: List[torch.Tensor]) -> None:
        for layer, kv in zip(self.layers, kv_caches):
            self.attn.backfill(self.g, layer.q(h), kv)


class EarlyExitModel(nn.Module):
    def __init__(self, cfg: ExitConfig, attn: LayerGroupAttention, head: ConfidenceHead,
                 kv_caches: List[List[torch.Tensor]]):
        super().__init__()
        self.cfg = cfg
        self.head = head
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.groups = nn.ModuleList([GroupBlock(cfg, g, attn) for g in range(cfg.num_groups)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.kv_caches = kv_caches

    def forward_to_depth(self, input_ids: torch.Tensor, depth: int, graph_bs: Optional[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(input_ids)
        confs = []
        for g in range(depth):
            h = self.groups[g](h, self.kv_caches[g], graph_bs)
            confs.append(self.head(h, g))
        if self.cfg.backfill_inline:
            for g in range(depth, self.cfg.num_groups):
                self.groups[g].backfill_kv(h, self.kv_caches[g])
        return self.lm_head(self.norm(h)), torch.stack(confs)

    def forward_eager(self, input_ids: torch.Tensor) -> Tuple[torch.Tensor, int]:
        h = self.embed(input_ids)
        depth = self.cfg.num_groups
        for g in range(self.cfg.num_groups):
            h = self.groups[g](h, self.kv_caches[g], None)
            if g + 1 >= self.cfg.min_depth and self.head.should_exit(h, g):
                depth = g + 1
                break
        return self.lm_head(self.norm(h)), depth
