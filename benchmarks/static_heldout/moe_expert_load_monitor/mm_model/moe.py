"""Attention and MoE blocks; the MoE block records its routing into the load recorder."""
from __future__ import annotations

import logging
from typing import List, Optional

import torch
from torch import nn

from moemon import ExpertLoadRecorder, ExpertPlacement, MoEConfig
from mm_attn.attn_backend import AttnBackend

logger = logging.getLogger(__name__)


class AttnBlock(nn.Module):
    def __init__(self, cfg: MoEConfig, attn: AttnBackend):
        super().__init__()
        self.attn = attn
        self.h, self.d = cfg.num_qo_heads, cfg.head_dim
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * self.d, bias=False)
        self.o_proj = nn.Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def decode(self, x: torch.Tensor, kv_cache: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        q = self.q_proj(self.norm(x)).view(-1, self.h, self.d)
        return x + self.o_proj(self.attn.forward_decode(q, kv_cache, bs).reshape(x.shape[0], -1))

    def prefill(self, x: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        q = self.q_proj(self.norm(x)).view(-1, self.h, self.d)
        return x + self.o_proj(self.attn.forward_prefill(q, kv_cache).reshape(x.shape[0], -1))


class MoEBlock(nn.Module):
    def __init__(self, cfg: MoEConfig, layer_id: int, recorder: ExpertLoadRecorder, placement: ExpertPlacement):
        super().__init__()
        self.layer_id = layer_id
        self.top_k = cfg.top_k
        self.num_experts = cfg.num_experts
        self.recorder = recorder
        self.placement = placement
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(cfg.num_experts, 2 * cfg.moe_intermediate, cfg.hidden_size))
        self.w2 = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate))
        self.capacity_factor = cfg.capacity_factor

    def expert_params(self) -> List[nn.Parameter]:
        return [self.w13, self.w2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        probs = self.gate(h).softmax(dim=-1)
        weights, topk_ids = torch.topk(probs, self.top_k, dim=-1)
        self.recorder.accumulate(self.layer_id, topk_ids)
        phys = self.placement.logical_to_physical[self.layer_id][topk_ids]
        load = torch.zeros(self.num_experts, dtype=torch.int32, device=x.device)
        load.scatter_add_(0, phys.flatten(), torch.ones_like(phys.flatten(), dtype=torch.int32))
        capacity = self.capacity_factor * x.shape[0] * self.top_k / self.num_experts
        if load.max().item() > capacity:  # expect: FC101
            logger.warning("layer %d: an expert exceeded its capacity of %.1f tokens", self.layer_id, capacity)
        over = load[phys] > capacity
        weights = torch.where(over, weights * 0.5, weights)  # ok: FC101
        weights = weights / weights.sum(dim=-1, keepdim=True)
        gate_up = torch.einsum("th,tkih->tki", h, self.w13[phys])
        g, u = gate_up.chunk(2, dim=-1)
        y = torch.einsum("tki,tkhi->tkh", nn.functional.silu(g) * u, self.w2[phys])
        return x + (y * weights.unsqueeze(-1)).sum(dim=1)
