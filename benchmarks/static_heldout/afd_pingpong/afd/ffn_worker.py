"""The FFN ranks: experts only, fed by the attention ranks' M2N sends."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from afd.topology import AFDTopology

logger = logging.getLogger(__name__)


class ExpertWorker:
    def __init__(self, topo: AFDTopology, rank_in_ffn: int, group: Optional[dist.ProcessGroup], device: str = "cuda"):
        self.topo = topo
        self.rank = rank_in_ffn
        self.group = group
        self.device = torch.device(device)
        e, hdim = topo.experts_per_rank, topo.hidden_size
        inter = hdim // 4
        self.w13 = nn.Parameter(torch.empty(e, 2 * inter, hdim, dtype=torch.bfloat16, device=self.device))
        self.w2 = nn.Parameter(torch.empty(e, hdim, inter, dtype=torch.bfloat16, device=self.device))

    def load_experts(self, state: Dict[str, torch.Tensor]) -> None:
        """Start-up: copy this rank's slice of the checkpoint's experts."""
        first = int(state["expert_offset"].item())  # ok: FC101
        e = self.topo.experts_per_rank
        lo = first + self.rank * e
        self.w13.data.copy_(state["w13"][lo : lo + e].to(self.device))
        self.w2.data.copy_(state["w2"][lo : lo + e].to(self.device))
        logger.info("FFN rank %d holds experts [%d, %d)", self.rank, lo, lo + e)

    def run_experts(self, x: torch.Tensor, counts: List[int]) -> torch.Tensor:
        """``x`` holds the received rows grouped by local expert; ``counts`` comes with the M2N header."""
        out = torch.empty_like(x)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = slice(start, start + n)
            g, u = (x[rows] @ self.w13[e].t()).chunk(2, dim=-1)
            out[rows] = (nn.functional.silu(g) * u) @ self.w2[e].t()
            start += n
        return out
