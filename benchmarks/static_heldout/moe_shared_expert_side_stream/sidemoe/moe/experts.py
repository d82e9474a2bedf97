"""The shared expert (a gated dense MLP every token goes through) and the routed experts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SharedExpertMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden_size, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden_size, bias=False)
        self.shared_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return torch.sigmoid(self.shared_gate(x)) * self.down(F.silu(g) * u)


class RoutedExperts(nn.Module):
    """Tokens are sorted by expert and padded to the heaviest expert for two batched matmuls."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate: int, top_k: int):
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden_size))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate))

    def forward(self, hidden: torch.Tensor, topk_w: torch.Tensor, topk_ids: torch.Tensor,
                offsets_out: torch.Tensor) -> torch.Tensor:
        flat_ids = topk_ids.flatten().long()
        tokens_per_expert = torch.bincount(flat_ids, minlength=self.num_experts)
        torch.cumsum(tokens_per_expert, 0, out=offsets_out[1:])
        max_load = int((offsets_out[1:] - offsets_out[:-1]).max())  # expect: FC101
        order = torch.argsort(flat_ids, stable=True)
        sorted_ids = flat_ids[order]
        token_of = order // self.top_k
        starts = offsets_out[:-1].long()
        rank = torch.arange(flat_ids.numel(), device=hidden.device) - starts[sorted_ids]
        padded = hidden.new_zeros(self.num_experts, max_load, hidden.shape[1])
        padded[sorted_ids, rank] = hidden.index_select(0, token_of)
        g, u = torch.bmm(padded, self.w13.transpose(1, 2)).chunk(2, dim=-1)
        y = torch.bmm(F.silu(g) * u, self.w2.transpose(1, 2))
        y_tok = y[sorted_ids, rank] * topk_w.flatten()[order].unsqueeze(-1)
        out = torch.zeros_like(hidden)
        out.index_add_(0, token_of, y_tok)
        return out
