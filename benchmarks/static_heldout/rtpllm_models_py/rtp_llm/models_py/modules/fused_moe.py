"""Fused MoE experts (torch reference path) with a per-module workspace cache."""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn


def _round_up(x: int, multiple: int) -> int:
    assert multiple > 0 and multiple & (multiple - 1) == 0, "the rounding multiple must be a power of two"  # ok: FC109
    return (x + multiple - 1) // multiple * multiple


def select_experts(
    router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True
) -> Tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def fused_experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    workspace: torch.Tensor,
    expert_map: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    assert hidden_states.shape[1] == w13.shape[2], "hidden size does not match the expert weights"  # expect: FC109
    num_tokens = hidden_states.shape[0]
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    if expert_map is not None:
        # global -> local expert ids; experts owned by other EP ranks become -1
        topk_ids = torch.where(topk_ids >= 0, expert_map[topk_ids.long()], topk_ids)  # ok: FC101
    flat_ids = topk_ids.flatten()
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids.long() + 1, minlength=num_experts + 1)[1:]
    counts_host = counts.tolist()  # expect: FC101
    token_idx = order // top_k
    flat_weights = topk_weights.flatten()
    gate_up = workspace[: num_tokens * top_k * two_inter].view(num_tokens * top_k, two_inter)
    out = torch.zeros_like(hidden_states)
    # rows routed to another rank sort first (id -1); skip them
    start = num_tokens * top_k - sum(counts_host)  # ok: FC101
    for e, n in enumerate(counts_host):
        if n == 0:
            continue
        rows = token_idx[start : start + n]
        gu = gate_up[start : start + n]
        torch.matmul(hidden_states.index_select(0, rows), w13[e].t(), out=gu)
        act = F.silu(gu[:, :inter]) * gu[:, inter:]
        y = act @ w2[e].t()
        w = flat_weights.index_select(0, order[start : start + n]).unsqueeze(1).to(y.dtype)
        out.index_add_(0, rows, y * w)
        start += n
    return out


class FusedMoe(nn.Module):
    def __init__(self, config, *, device: torch.device, ep_rank: int = 0, ep_size: int = 1):
        super().__init__()
        self.hidden = config.hidden_size
        self.inter = config.moe_inter_padding_size
        self.num_experts = config.expert_num
        self.top_k = config.moe_k
        self.dtype = config.data_type
        self.device = device
        local = self.num_experts // ep_size
        self.gate = nn.Linear(self.hidden, self.num_experts, bias=False, dtype=self.dtype, device=device)
        self.w13 = nn.Parameter(
            torch.empty(local, 2 * self.inter, self.hidden, dtype=self.dtype, device=device), requires_grad=False
        )
        self.w2 = nn.Parameter(
            torch.empty(local, self.hidden, self.inter, dtype=self.dtype, device=device), requires_grad=False
        )
        self.expert_map = self._build_expert_map(ep_rank, ep_size)
        self._workspace: Optional[torch.Tensor] = None
        self._workspace_tokens = 0

    def _build_expert_map(self, ep_rank: int, ep_size: int) -> Optional[torch.Tensor]:
        if ep_size == 1:
            return None
        local = self.num_experts // ep_size
        expert_map = torch.full((self.num_experts,), -1, dtype=torch.int32, device=self.device)
        expert_map[ep_rank * local : (ep_rank + 1) * local] = torch.arange(local, dtype=torch.int32, device=self.device)
        return expert_map

    def _get_workspace(self, num_tokens: int) -> torch.Tensor:
        # grown to the largest step seen so far, in 64-token steps
        if self._workspace is None or num_tokens > self._workspace_tokens:
            self._workspace_tokens = _round_up(num_tokens, 64)
            self._workspace = torch.empty(  # expect: FC107
                self._workspace_tokens * self.top_k * 2 * self.inter, dtype=self.dtype, device=self.device
            )
        return self._workspace

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        router_logits = self.gate(hidden_states)
        topk_weights, topk_ids = select_experts(router_logits, self.top_k)
        return fused_experts(
            hidden_states,
            self.w13,
            self.w2,
            topk_weights,
            topk_ids,
            workspace=self._get_workspace(hidden_states.shape[0]),
            expert_map=self.expert_map,
        )
