"""Top-k router and a dispatcher that groups tokens by expert for the grouped GEMM."""
from typing import List, Optional, Tuple

import torch
from torch import nn

from gptoss.config import GptOssConfig


class Router(nn.Module):
    def __init__(self, cfg: GptOssConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts)
        self.top_k = cfg.experts_per_token

    def forward(self, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.gate(h)
        weights, ids = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(weights.float(), dim=-1), ids


class DispatchPlan:
    """Built once per dispatch: the permutation of (token, slot) pairs into expert order."""

    def __init__(self, num_pairs: int, device: torch.device):
        self.order = torch.empty(num_pairs, dtype=torch.int64, device=device)  # ok: FC107
        self.inverse = torch.empty(num_pairs, dtype=torch.int64, device=device)


class ExpertDispatcher:
    def __init__(self, cfg: GptOssConfig, device: torch.device):
        self.num_experts = cfg.num_experts
        self.top_k = cfg.experts_per_token
        self.device = device
        self.capacity = cfg.max_num_tokens * cfg.experts_per_token
        self.counts = torch.zeros(cfg.num_experts, dtype=torch.int64, device=device)
        self.route_scratch: Optional[torch.Tensor] = None
        self.sorted_token_ids = torch.zeros(self.capacity, dtype=torch.int32, device=device)

    def _check_capacity(self) -> None:
        assert self.capacity >= self.top_k  # ok: FC109

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor) -> Tuple[torch.Tensor, List[int], DispatchPlan]:
        assert topk_ids.shape[1] == self.top_k  # expect: FC109
        self._check_capacity()
        n = hidden.shape[0]
        if self.route_scratch is None:
            self.route_scratch = torch.empty(self.capacity, dtype=torch.int64, device=self.device)  # ok: FC107
        flat = topk_ids.flatten()
        self.counts.zero_()
        self.counts.index_add_(0, flat, torch.ones_like(flat))
        split_sizes = self.counts.tolist()  # expect: FC101
        plan = DispatchPlan(n * self.top_k, self.device)
        torch.argsort(flat, stable=True, out=plan.order)
        plan.inverse[plan.order] = torch.arange(n * self.top_k, device=self.device)
        self.sorted_token_ids = torch.empty(n * self.top_k, dtype=torch.int32, device=self.device)  # expect: FC107
        self.sorted_token_ids.copy_(plan.order // self.top_k)
        return hidden.index_select(0, self.sorted_token_ids), split_sizes, plan


class MoEBlock(nn.Module):
    def __init__(self, cfg: GptOssConfig, dispatcher: ExpertDispatcher):
        super().__init__()
        self.router = Router(cfg)
        self.dispatcher = dispatcher
        self.w_in = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, 2 * cfg.intermediate_size))
        self.w_out = nn.Parameter(torch.empty(cfg.num_experts, cfg.intermediate_size, cfg.hidden_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.router(h)
        x, split_sizes, plan = self.dispatcher.dispatch(h, ids)
        outs = []
        for e, chunk in enumerate(torch.split(x, split_sizes)):
            gate, up = (chunk @ self.w_in[e]).chunk(2, dim=-1)
            outs.append((torch.nn.functional.silu(gate) * up) @ self.w_out[e])
        y = torch.cat(outs)[plan.inverse].view(h.shape[0], -1, h.shape[1])
        return (y * weights.unsqueeze(-1).to(y.dtype)).sum(dim=1)
