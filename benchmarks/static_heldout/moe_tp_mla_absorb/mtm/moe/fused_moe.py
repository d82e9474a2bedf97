"""Routed experts with expert parallelism: tokens are all-gathered, each rank runs its local experts with
a grouped GEMM (a split-per-expert loop where the grouped kernel is missing) and the sum is reduce-scattered."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mtm.config import EngineConfig
from mtm.parallel.tp import TPGroup

try:  # optional grouped GEMM kernel
    from grouped_gemm import gmm as _grouped_gemm  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover
    _grouped_gemm = None


class TopKRouter(nn.Module):
    """Sigmoid scores with a load-balancing bias that only affects the choice, not the weights."""
    def __init__(self, hidden: int, num_experts: int, top_k: int):
        super().__init__()
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.bias = nn.Parameter(torch.zeros(num_experts))
        self.top_k = top_k

    def forward(self, h: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        scores = torch.sigmoid(self.gate(h).float())
        topk_ids = (scores + self.bias).topk(self.top_k, dim=-1).indices
        topk_w = scores.gather(1, topk_ids)
        return topk_w / topk_w.sum(-1, keepdim=True), topk_ids


class FusedMoE(nn.Module):
    def __init__(self, cfg: EngineConfig, tp: TPGroup):
        super().__init__()
        m = cfg.model
        self.num_experts, self.top_k = m.num_experts, m.num_experts_per_tok
        self.ep_size, self.ep_rank = tp.world_size, tp.rank
        self.num_local_experts = m.num_experts // tp.world_size
        self.router = TopKRouter(m.hidden_size, m.num_experts, m.num_experts_per_tok)
        inter = m.moe_intermediate_size
        self.w13 = nn.Parameter(torch.empty(self.num_local_experts, 2 * inter, m.hidden_size))
        self.w2 = nn.Parameter(torch.empty(self.num_local_experts, m.hidden_size, inter))
        self.tp = tp
        self.first_local = self.ep_rank * self.num_local_experts
        self.register_buffer("local_expert_ids", torch.arange(self.num_local_experts), persistent=False)
        self.gemm_workspace: Optional[torch.Tensor] = None
        self.workspace_bytes = cfg.moe_workspace_bytes()

    def init_workspace(self, device: torch.device) -> None:
        self.gemm_workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.w13[e]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.w2[e])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        assert self.w13.shape[0] == self.num_local_experts  # ok: FC109
        topk_w, topk_ids = self.router(h)
        x, ids, w = h, topk_ids, topk_w
        if self.ep_size > 1:
            x, ids, w = self.tp.all_gather(h), self.tp.all_gather(topk_ids), self.tp.all_gather(topk_w)
        n = x.shape[0]
        local = ids - self.first_local
        is_local = (local >= 0) & (local < self.num_local_experts)
        local = torch.where(is_local, local, self.num_local_experts)  # overflow bucket
        flat = local.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_local_experts + 1)[: self.num_local_experts]
        token_of_slot = order // self.top_k
        x_sorted = x.index_select(0, token_of_slot)
        slots = n * self.top_k
        expert_of_slot = torch.repeat_interleave(self.local_expert_ids, counts, output_size=slots)  # ok: FC101
        if _grouped_gemm is not None:
            y = _grouped_gemm(x_sorted, self.w13, counts, expert_of_slot, workspace=self.gemm_workspace)
            gate, up = y.chunk(2, dim=-1)
            y = _grouped_gemm(F.silu(gate) * up, self.w2, counts, expert_of_slot, workspace=self.gemm_workspace)
        else:
            split_sizes = counts.tolist()  # expect: FC101
            chunks = torch.split(x_sorted[: sum(split_sizes)], split_sizes)
            y = torch.cat([self._expert(e, c) for e, c in enumerate(chunks)])
            y = F.pad(y, (0, 0, 0, slots - y.shape[0]))
        weight = (w.flatten() * is_local.flatten()).index_select(0, order).unsqueeze(-1)
        out = torch.zeros_like(x).index_add_(0, token_of_slot, (y * weight).to(x.dtype))
        return self.tp.reduce_scatter(out) if self.ep_size > 1 else out
