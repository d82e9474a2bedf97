"""Expert-parallel MoE: every rank's tokens padded to the largest rank's count, gathered,
run through this rank's experts, and reduce-scattered back."""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dpmoe import DPConfig, MoEPadPlan


class EPMoE(nn.Module):
    def __init__(self, cfg: DPConfig, group, device: torch.device) -> None:
        super().__init__()
        self.cfg, self.group = cfg, group
        e, h, i = cfg.experts_per_rank, cfg.hidden_size, cfg.intermediate_size
        self.gate = nn.Linear(h, cfg.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h, dtype=torch.bfloat16, device=device))
        self.w2 = nn.Parameter(torch.empty(e, h, i, dtype=torch.bfloat16, device=device))
        max_recv = cfg.max_tokens_per_rank * cfg.dp_size
        self.recv_buf = torch.empty(max_recv, h, dtype=torch.bfloat16, device=device)
        self.a2a_workspace = torch.empty(max_recv * h * 2, dtype=torch.uint8, device=device)  # ok: FC106
        self.first_expert = cfg.dp_rank * e
        self.plan: Optional[MoEPadPlan] = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.dispatch(hidden, self.plan)

    def dispatch(self, hidden: torch.Tensor, plan: MoEPadPlan) -> torch.Tensor:
        n, h = hidden.shape
        padded = plan.max_tokens
        need = padded * self.cfg.dp_size
        if self.recv_buf.shape[0] < need:
            self.recv_buf = torch.empty(need, h, dtype=hidden.dtype, device=hidden.device)  # expect: FC107
        send = hidden.new_zeros(padded, h)
        send[:n] = hidden
        gathered = self.recv_buf[:need]
        dist.all_gather_into_tensor(gathered, send, group=self.group)
        out = self._experts(gathered)
        local = torch.empty_like(send)
        dist.reduce_scatter_tensor(local, out, group=self.group)
        return local[:n]

    def _experts(self, x: torch.Tensor) -> torch.Tensor:
        k, e_local, i = self.cfg.top_k, self.cfg.experts_per_rank, self.cfg.intermediate_size
        weights, ids = torch.topk(self.gate(x).softmax(-1), k, dim=-1)
        local_ids = ids - self.first_expert
        mine = (local_ids >= 0) & (local_ids < e_local)
        flat = torch.where(mine, local_ids, e_local).flatten()  # other ranks' experts sort last
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=e_local + 1)
        out = torch.zeros_like(x)
        start = 0
        for e, cnt in enumerate(counts[:-1].tolist()):  # expect: FC101
            idx = order[start : start + cnt]
            rows = idx // k
            gate_up = x.index_select(0, rows) @ self.w13[e].t()
            act = F.silu(gate_up[:, :i]) * gate_up[:, i:]
            out.index_add_(0, rows, (act @ self.w2[e].t()) * weights.flatten().index_select(0, idx).unsqueeze(1))
            start += cnt
        return out
