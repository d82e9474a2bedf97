from __future__ import annotations

import torch
from torch import nn

from dserve.moe.ep_dispatcher import EPDispatcher


class EPMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, dispatcher: EPDispatcher):
        super().__init__()
        self.top_k = top_k
        self.dispatcher = dispatcher
        self.num_local_experts = dispatcher.num_local_experts
        self.w13 = nn.Parameter(torch.empty(self.num_local_experts, 2 * intermediate_size, hidden_size))
        self.w2 = nn.Parameter(torch.empty(self.num_local_experts, hidden_size, intermediate_size))

    def grouped_gemm_masked(self, x: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> torch.Tensor:
        return torch.ops.dserve.grouped_gemm_masked(x, self.w13, self.w2, masked_m, expected_m)

    def grouped_gemm_contiguous(self, x: torch.Tensor, num_tokens_per_expert) -> torch.Tensor:
        return torch.ops.dserve.grouped_gemm_contiguous(x, self.w13, self.w2, num_tokens_per_expert)

    def forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor, is_extend: bool) -> torch.Tensor:
        topk_weights, topk_idx = torch.topk(router_logits.softmax(dim=-1), self.top_k, dim=-1)
        out = self.dispatcher.dispatch(hidden_states, topk_idx.to(torch.int64), topk_weights, is_extend)
        if out.masked_m is not None:
            y = self.grouped_gemm_masked(out.hidden_states, out.masked_m, out.expected_m)
        else:
            if sum(out.num_recv_tokens_per_expert) == 0:  # ok: FC101
                return self.dispatcher.combine(out.hidden_states, out.topk_idx, out.topk_weights)
            y = self.grouped_gemm_contiguous(out.hidden_states, out.num_recv_tokens_per_expert)
        return self.dispatcher.combine(y, out.topk_idx, out.topk_weights)
