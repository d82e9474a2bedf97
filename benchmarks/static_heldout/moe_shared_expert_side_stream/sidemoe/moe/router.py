"""Top-k softmax router."""

from __future__ import annotations

import torch
from torch import nn


class TopKRouter(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, top_k: int, renormalize: bool = True):
        super().__init__()
        assert 0 < top_k <= num_experts  # expect: FC109
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.top_k = top_k
        self.renormalize = renormalize

    def forward(self, hidden: torch.Tensor):
        scores = torch.softmax(self.gate(hidden), dim=-1, dtype=torch.float32)
        topk_w, topk_ids = torch.topk(scores, self.top_k, dim=-1)
        if self.renormalize:
            topk_w = topk_w / topk_w.sum(dim=-1, keepdim=True)
        return topk_w.to(hidden.dtype), topk_ids.to(torch.int32)
