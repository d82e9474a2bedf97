from typing import List

import torch
from torch import nn

from kvtiers import TierConfig
from tier_attn.attention import TieredAttention
from tier_attn.meta import TierStepMeta


class TierDecoderLayer(nn.Module):
    def __init__(self, cfg: TierConfig, attn: TieredAttention, layer_id: int):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.layer_id = layer_id
        self.attn = attn
        self.heads = cfg.num_qo_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.SiLU(), nn.Linear(4 * hidden, hidden))

    def forward(self, h: torch.Tensor, kv: List[List[torch.Tensor]], meta: TierStepMeta) -> torch.Tensor:
        q = self.q_proj(h).view(-1, self.heads, self.head_dim)
        o = self.attn.forward_decode(q, kv[self.layer_id], meta)
        h = h + self.o_proj(o.reshape(h.shape[0], -1))
        return h + self.mlp(h)


class TierModel(nn.Module):
    def __init__(self, cfg: TierConfig, attn: TieredAttention, vocab: int = 151936):
        super().__init__()
        hidden = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList([TierDecoderLayer(cfg, attn, i) for i in range(cfg.num_layers)])
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor, kv: List[List[torch.Tensor]], meta: TierStepMeta) -> torch.Tensor:
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h, kv, meta)
        return self.lm_head(h)
