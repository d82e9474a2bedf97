"""Expert-parallel MoE layer reading its experts from physical slots the rebalancer may rewrite."""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from eplb.kernels import count_slot_tokens, remap_topk_ids
from eplb.placement import ExpertPlacement
from eplb.recorder import ExpertLoadRecorder
from srt_moe.config import MoEModelConfig

logger = logging.getLogger(__name__)


class EPMoE(nn.Module):
    def __init__(
        self,
        cfg: MoEModelConfig,
        moe_idx: int,
        placement: ExpertPlacement,
        recorder: ExpertLoadRecorder,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.moe_idx = moe_idx
        self.top_k = cfg.top_k
        self.num_physical = cfg.num_physical_experts
        self.hidden = cfg.hidden_size
        self.inter = cfg.moe_intermediate_size
        self._backend = "torch"  # grouped GEMM implementation
        self.recorder = recorder
        tokens = cfg.max_running_requests * cfg.top_k
        self.capacity = int(cfg.capacity_factor * tokens / cfg.num_physical_experts) + 1
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)

        # logical experts stay pinned on the host; the physical slots the graphs read live on the device
        h, i, e = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
        self.w13_host = (torch.randn(e, 2 * i, h) * 0.02).to(cfg.dtype).pin_memory()
        self.w2_host = (torch.randn(e, h, i) * 0.02).to(cfg.dtype).pin_memory()
        slots = torch.from_numpy(placement.phy2log.astype(np.int64))
        self.w13_weight = self.w13_host.index_select(0, slots).to(device)
        self.w2_weight = self.w2_host.index_select(0, slots).to(device)
        self.log2phy_buf = torch.from_numpy(placement.log2phy_np.astype(np.int64)).to(device)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self._backend == "deepgemm":  # ok: FC103
            raise NotImplementedError("DeepGEMM grouped GEMM is not wired into this build")
        t = hidden.shape[0]
        probs = self.gate(hidden).float().softmax(dim=-1)
        topk_w, topk_ids = torch.topk(probs, self.top_k, dim=-1)
        topk_w = topk_w / topk_w.sum(dim=-1, keepdim=True)
        phys = remap_topk_ids(topk_ids, self.log2phy_buf, self.num_physical)

        counts_row = self.recorder.step_counts[self.moe_idx]
        count_slot_tokens(phys, counts_row)
        over = int((counts_row > self.capacity).sum())  # expect: FC101
        if over:
            logger.warning("MoE layer %d: %d expert slots over capacity this step", self.moe_idx, over)

        flat = phys.flatten()
        w13 = self.w13_weight.index_select(0, flat).view(t, self.top_k, 2 * self.inter, self.hidden)
        gate, up = torch.einsum("th,tkoh->tko", hidden, w13).chunk(2, dim=-1)
        act = F.silu(gate) * up
        w2 = self.w2_weight.index_select(0, flat).view(t, self.top_k, self.hidden, self.inter)
        out = torch.einsum("tki,tkhi->tkh", act, w2)
        return (out * topk_w.unsqueeze(-1).to(out.dtype)).sum(dim=1)
