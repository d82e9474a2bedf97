"""Decoder stand-in: each step decodes the bucket's rows and one piggybacked prompt chunk."""

import torch
from torch import nn

from autotune.config import AutotuneConfig
from autotune_rt.attention import BucketAttention


class BucketDecoder(nn.Module):
    def __init__(self, cfg: AutotuneConfig, attn: BucketAttention, kv_cache: torch.Tensor):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        self.kv_cache = kv_cache
        d = cfg.hidden_size
        qd = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, d)
        self.q_proj = nn.ModuleList([nn.Linear(d, qd, bias=False) for _ in range(cfg.num_layers)])
        self.o_proj = nn.ModuleList([nn.Linear(qd, d, bias=False) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(d, cfg.vocab_size, bias=False)

    def forward_bucket(self, input_ids: torch.Tensor, chunk_ids: torch.Tensor, bs: int) -> torch.Tensor:
        c = self.cfg
        h = self.embed(input_ids)
        hc = self.embed(chunk_ids)
        nc = chunk_ids.shape[0]
        for layer in range(c.num_layers):
            kv = self.kv_cache[layer]
            q = self.q_proj[layer](h).view(bs, c.num_qo_heads, c.head_dim)
            qc = self.q_proj[layer](hc).view(nc, c.num_qo_heads, c.head_dim)
            o = self.attn.forward_decode(q, kv, bs)
            oc = self.attn.forward_chunk(qc, kv, bs)
            h = h + self.o_proj[layer](o.reshape(bs, -1))
            hc = hc + self.o_proj[layer](oc.reshape(nc, -1))
        return self.lm_head(h)

    def forward_eager(self, input_ids: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        n = input_ids.shape[0]
        h = self.embed(input_ids)
        for layer in range(c.num_layers):
            q = self.q_proj[layer](h).view(n, c.num_qo_heads, c.head_dim)
            o = self.attn.forward_eager(q, self.kv_cache[layer])
            h = h + self.o_proj[layer](o.reshape(n, -1))
        return self.lm_head(h)
