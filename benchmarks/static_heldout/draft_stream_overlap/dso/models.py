"""Draft (EAGLE-style, fed the target's hidden states) and target decoders."""
from typing import List, Optional, Tuple

import torch
from torch import nn

from dso.attn import ModelAttnState
from dso.config import ModelShape, SpecConfig


def _kv_pool(shape: ModelShape, scfg: SpecConfig, device: torch.device) -> List[torch.Tensor]:
    return [
        torch.zeros(scfg.num_pages, 2, shape.num_kv_heads, scfg.page_size, shape.head_dim,
                    dtype=torch.bfloat16, device=device)
        for _ in range(shape.num_layers)
    ]


class _Decoder(nn.Module):
    def __init__(self, shape: ModelShape, attn: ModelAttnState, scfg: SpecConfig, device: torch.device):
        super().__init__()
        self.shape = shape
        self.attn = attn
        self.embed = nn.Embedding(shape.vocab_size, shape.hidden_size)
        qdim = shape.num_qo_heads * shape.head_dim
        self.q_proj = nn.ModuleList([nn.Linear(shape.hidden_size, qdim) for _ in range(shape.num_layers)])
        self.o_proj = nn.ModuleList([nn.Linear(qdim, shape.hidden_size) for _ in range(shape.num_layers)])
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        self.kv = _kv_pool(shape, scfg, device)

    def _q(self, proj: nn.Linear, h: torch.Tensor) -> torch.Tensor:
        return proj(h).view(h.shape[0], self.shape.num_qo_heads, self.shape.head_dim)


class DraftModel(_Decoder):
    def __init__(self, shape: ModelShape, attn: ModelAttnState, scfg: SpecConfig, device: torch.device):
        super().__init__(shape, attn, scfg, device)
        self.fuse = nn.Linear(2 * shape.hidden_size, shape.hidden_size)

    def decode_step(self, ids: torch.Tensor, pos: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        h = self.fuse(torch.cat([self.embed(ids), hidden], dim=-1))
        for q_proj, o_proj, kv in zip(self.q_proj, self.o_proj, self.kv):
            h = h + o_proj(self.attn.decode_attention(self._q(q_proj, h), kv).flatten(1))
        return self.lm_head(h)

    def extend_step(self, ids: torch.Tensor, pos: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """Re-ingest the accepted tokens (several per request) after verification."""
        h = self.fuse(torch.cat([self.embed(ids), hidden], dim=-1))
        for q_proj, o_proj, kv in zip(self.q_proj, self.o_proj, self.kv):
            h = h + o_proj(self.attn.extend_attention(self._q(q_proj, h), kv).flatten(1))
        return self.lm_head(h)


class TargetModel(_Decoder):
    def decode_step(self, ids: torch.Tensor, pos: torch.Tensor, hidden: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Plain decode, used when speculation is switched off for large batches."""
        h = self.embed(ids)
        for q_proj, o_proj, kv in zip(self.q_proj, self.o_proj, self.kv):
            h = h + o_proj(self.attn.decode_attention(self._q(q_proj, h), kv).flatten(1))
        return self.lm_head(h)

    def verify(self, ids: torch.Tensor, pos: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(ids)
        for q_proj, o_proj, kv in zip(self.q_proj, self.o_proj, self.kv):
            h = h + o_proj(self.attn.verify_attention(self._q(q_proj, h), kv).flatten(1))
        return self.lm_head(h), h
