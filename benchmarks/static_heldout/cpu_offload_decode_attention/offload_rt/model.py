"""Decoder split at the attention: ``gpu_part`` (projections, KV write, GPU window + sink attention) is what the
decode graphs record; the host part is merged in eagerly and ``post_attention`` finishes the layer."""

from __future__ import annotations

from typing import Tuple

import torch
from torch import nn

from offattn.batch import OffloadBatch
from offattn.config import OffloadConfig
from offload_rt.gpu_attention import RecentWindowAttention


class OffloadLayer(nn.Module):
    def __init__(self, cfg: OffloadConfig, layer_id: int, attn: RecentWindowAttention):
        super().__init__()
        self.layer_id = layer_id
        self.attn = attn
        self.nq, self.nkv, self.hd = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim
        self.norm1 = nn.RMSNorm(cfg.hidden_size)
        self.norm2 = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=False)
        self.o = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size), nn.SiLU(),
                                 nn.Linear(4 * cfg.hidden_size, cfg.hidden_size))

    def gpu_part(self, h: torch.Tensor, batch: OffloadBatch) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(self.norm1(h)).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q = q.view(-1, self.nq, self.hd)
        o, lse = self.attn.forward_gpu_part(q, k.view(-1, self.nkv, self.hd), v.view(-1, self.nkv, self.hd),
                                            self.layer_id, batch)
        return o, lse, q

    def post_attention(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        h = h + self.o(o.to(h.dtype).flatten(1))
        return h + self.mlp(self.norm2(h))


class OffloadLM(nn.Module):
    def __init__(self, cfg: OffloadConfig, attn: RecentWindowAttention):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([OffloadLayer(cfg, i, attn) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
