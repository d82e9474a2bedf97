"""Routed experts behind the all-to-all dispatcher."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from epserve.config import EPConfig
from epserve.dist.a2a import AllToAllDispatcher


class LocalExperts(nn.Module):
    """The experts this rank owns, as one grouped GEMM over the received slots."""

    def __init__(self, cfg: EPConfig, device: torch.device):
        super().__init__()
        n_local = cfg.num_experts // cfg.ep_size
        self.first_expert = 0
        self.w13 = nn.Parameter(torch.empty(n_local, 2 * cfg.moe_intermediate, cfg.hidden_size, device=device))
        self.w2 = nn.Parameter(torch.empty(n_local, cfg.hidden_size, cfg.moe_intermediate, device=device))

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        local = (expert_ids - self.first_expert).clamp(min=0, max=self.w13.shape[0] - 1)
        gate_up = torch.bmm(self.w13[local], x.unsqueeze(-1)).squeeze(-1)
        gate, up = gate_up.chunk(2, dim=-1)
        y = torch.bmm(self.w2[local], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
        return torch.where((expert_ids >= 0)[:, None], y, torch.zeros_like(y))


class MoELayer(nn.Module):
    def __init__(self, cfg: EPConfig, dispatcher: AllToAllDispatcher, device: torch.device):
        super().__init__()
        self.top_k = cfg.top_k
        self.gate_weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, device=device))
        self.experts = LocalExperts(cfg, device)
        self.dispatcher = dispatcher
        # decode batches fit the capacity plan; prefill chunks run dropless
        self.capacity_cutoff = cfg.max_batch_size

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.gate_weight)
        weights, topk_ids = torch.topk(logits.softmax(dim=-1), self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        dropless = hidden.shape[0] > self.capacity_cutoff
        res = self.dispatcher.dispatch(hidden, topk_ids, weights, dropless)
        expert_out = self.experts(res.a2a_recv, res.recv_expert_ids)
        return self.dispatcher.combine(expert_out, res, hidden.shape[0])
