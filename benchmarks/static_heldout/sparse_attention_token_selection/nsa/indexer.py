"""The lightweight indexer: a few low-dimensional heads score every KV page of a request."""

from __future__ import annotations

import torch
import torch.nn as nn


class LightningIndexer(nn.Module):
    def __init__(self, hidden_size: int, index_heads: int, index_dim: int, page_size: int):
        super().__init__()
        assert index_dim % 16 == 0, "index_dim must be a multiple of 16"  # expect: FC109
        self.index_heads = index_heads
        self.index_dim = index_dim
        self.page_size = page_size
        self.q_proj = nn.Linear(hidden_size, index_heads * index_dim, bias=False)
        self.head_gate = nn.Linear(hidden_size, index_heads, bias=False)

    def forward(
        self,
        hidden: torch.Tensor,
        page_keys: torch.Tensor,
        block_table: torch.Tensor,
        num_pages: torch.Tensor,
        out_scores: torch.Tensor,
    ) -> torch.Tensor:
        """Scores [bs, max_pages]; pages past a request's end score -inf."""
        bs = hidden.shape[0]
        q = self.q_proj(hidden).view(bs, self.index_heads, self.index_dim)
        gate = torch.sigmoid(self.head_gate(hidden))
        keys = page_keys[block_table[:bs]]
        logits = torch.einsum("bhd,bpd->bhp", q, keys).relu()
        scores = (logits * gate.unsqueeze(-1)).sum(dim=1)
        col = torch.arange(block_table.shape[1], device=hidden.device)
        valid = col.unsqueeze(0) < num_pages[:bs].unsqueeze(1)
        scores = torch.where(valid, scores, torch.full_like(scores, float("-inf")))  # ok: FC101
        out_scores[:bs, : scores.shape[1]].copy_(scores)
        return out_scores[:bs, : scores.shape[1]]
