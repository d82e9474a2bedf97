"""A tensor-parallel decoder: heads split across ranks, LM head split by vocabulary."""
from __future__ import annotations

import torch
from torch import nn

from vpsample.attn.metadata import RankAttnMetadata
from vpsample.config import TPServeConfig
from vpsample.dist import TPGroup
from vpsample.layout import VocabShard


class TPAttentionLayer(nn.Module):
    def __init__(self, cfg: TPServeConfig, meta: RankAttnMetadata, group: TPGroup, layer_id: int, device: torch.device):
        super().__init__()
        self.meta = meta
        self.group = group
        self.layer_id = layer_id
        self.h, self.kv, self.d = cfg.local_qo_heads, cfg.local_kv_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kv) * self.d, bias=False, dtype=cfg.dtype)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False, dtype=cfg.dtype)
        shape = (cfg.max_pages, self.kv, cfg.page_size, self.d)
        self.k_cache = torch.zeros(shape, dtype=cfg.dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=cfg.dtype, device=device)

    def forward(self, h: torch.Tensor, out_page: torch.Tensor, out_off: torch.Tensor, bs: int) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(h)).split([self.h * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        self.k_cache[out_page, :, out_off] = k.view(bs, self.kv, self.d)
        self.v_cache[out_page, :, out_off] = v.view(bs, self.kv, self.d)
        o = self.meta.forward_decode(q.view(bs, self.h, self.d), (self.k_cache, self.v_cache), bs)
        out = self.o_proj(o.reshape(bs, -1))
        self.group.all_reduce_sum(out)
        return h + out


class VocabParallelLM(nn.Module):
    def __init__(
        self, cfg: TPServeConfig, meta: RankAttnMetadata, group: TPGroup, shard: VocabShard, device: torch.device
    ):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=cfg.dtype)
        self.pos = nn.Embedding(cfg.max_context_len, cfg.hidden_size, dtype=cfg.dtype)
        self.layers = nn.ModuleList([TPAttentionLayer(cfg, meta, group, i, device) for i in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size)
        # this rank's slice of the vocabulary
        self.lm_head_shard = nn.Linear(cfg.hidden_size, shard.size, bias=False, dtype=cfg.dtype)

    def decode(self, ids: torch.Tensor, positions: torch.Tensor, out_page, out_off, bs: int) -> torch.Tensor:
        h = self.embed(ids) + self.pos(positions)
        for layer in self.layers:
            h = layer(h, out_page, out_off, bs)
        return self.lm_head_shard(self.norm(h))
