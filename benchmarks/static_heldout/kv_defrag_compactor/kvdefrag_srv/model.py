"""A decoder stand-in: projections around the paged attention, enough to capture a real graph."""

import torch
from torch import nn

from kvdefrag.config import DefragConfig
from kvdefrag_srv.attention import DefragAttention


class DefragDecoder(nn.Module):
    def __init__(self, cfg: DefragConfig, attn: DefragAttention):
        super().__init__()
        self.cfg = cfg
        self.attn = attn
        hidden = cfg.hidden_size
        q_dim = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab_size, hidden)
        self.q_proj = nn.ModuleList([nn.Linear(hidden, q_dim, bias=False) for _ in range(cfg.num_layers)])
        self.o_proj = nn.ModuleList([nn.Linear(q_dim, hidden, bias=False) for _ in range(cfg.num_layers)])
        self.norm = nn.RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, cfg.vocab_size, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, positions: torch.Tensor, bs: int) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in range(self.cfg.num_layers):
            q = self.q_proj[layer](h).view(bs, self.cfg.num_qo_heads, self.cfg.head_dim)
            o = self.attn.forward_decode(q, layer, bs)
            h = h + self.o_proj[layer](o.reshape(bs, -1))
        return self.lm_head(self.norm(h))

    def forward_long(self, input_ids: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[0]
        h = self.embed(input_ids)
        for layer in range(self.cfg.num_layers):
            q = self.q_proj[layer](h).view(n, self.cfg.num_qo_heads, self.cfg.head_dim)
            o = self.attn.forward_long(q, layer, block_tables, seq_lens)
            h = h + self.o_proj[layer](o.reshape(n, -1))
        return self.lm_head(self.norm(h))
