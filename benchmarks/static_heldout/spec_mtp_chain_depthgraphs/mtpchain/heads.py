"""MTP heads: each head is one transformer block plus a shared LM head."""

from typing import TYPE_CHECKING, List

import torch
from torch import nn

from mtpchain.config import MTPConfig

if TYPE_CHECKING:
    from mtpchain_rt.attention import ChainAttention


class MTPHead(nn.Module):
    def __init__(self, cfg: MTPConfig, depth: int):
        super().__init__()
        self.depth = depth
        self.cfg = cfg
        self.enorm = nn.RMSNorm(cfg.hidden_size)
        self.hnorm = nn.RMSNorm(cfg.hidden_size)
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_qo_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_qo_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.hidden_size, 4 * cfg.hidden_size, bias=False),
            nn.SiLU(),
            nn.Linear(4 * cfg.hidden_size, cfg.hidden_size, bias=False),
        )

    def forward(self, hidden, token_emb, attn: "ChainAttention", bs: int):
        x = self.eh_proj(torch.cat([self.enorm(token_emb), self.hnorm(hidden)], dim=-1))
        q = self.q_proj(x).view(bs, self.cfg.num_qo_heads, self.cfg.head_dim)
        o = attn.forward_depth(q, self.depth, bs)
        x = x + self.o_proj(o.reshape(bs, -1))
        return x + self.mlp(x)


class MTPChain(nn.Module):
    """The chain of heads plus the embedding / LM head shared with the target."""

    def __init__(self, cfg: MTPConfig, num_heads: int, embed: nn.Embedding, lm_head: nn.Linear):
        super().__init__()
        assert num_heads >= 1, "an MTP chain needs at least one head"  # expect: FC109
        self.cfg = cfg
        self.heads = nn.ModuleList([MTPHead(cfg, d) for d in range(num_heads)])
        self.embed = embed
        self.lm_head = lm_head

    def _check_chain(self) -> None:
        n = len(self.heads)
        assert n == self.cfg.num_mtp_heads, "chain length drifted from the config"  # ok: FC109

    def depth_forward(self, d: int, hidden, tokens, attn: "ChainAttention", bs: int):
        h = self.heads[d](hidden, self.embed(tokens), attn, bs)
        logits = self.lm_head(h)
        return h, torch.argmax(logits, dim=-1)

    def heads_list(self) -> List[MTPHead]:
        self._check_chain()
        return list(self.heads)
