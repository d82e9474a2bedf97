"""Expert-parallel token dispatch over DeepEP (normal mode for prefill, low-latency mode for decode)."""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Deque, List, Optional

import torch

try:
    from deep_ep import Buffer as DeepEPBuffer
except ImportError:  # pragma: no cover
    DeepEPBuffer = None

logger = logging.getLogger(__name__)


class DeepEPMode(Enum):
    NORMAL = "normal"
    LOW_LATENCY = "low_latency"
    AUTO = "auto"

    def resolve(self, is_extend: bool) -> "DeepEPMode":
        if self != DeepEPMode.AUTO:
            return self
        return DeepEPMode.NORMAL if is_extend else DeepEPMode.LOW_LATENCY


@dataclass
class DispatchOutput:
    hidden_states: torch.Tensor
    topk_idx: torch.Tensor
    topk_weights: torch.Tensor
    num_recv_tokens_per_expert: List[int]
    masked_m: Optional[torch.Tensor] = None
    expected_m: Optional[int] = None


class EPDispatcher:
    def __init__(self, group, num_experts: int, hidden_size: int, deepep_mode: DeepEPMode, num_max_dispatch_tokens_per_rank: int = 128):
        self.group = group
        self.ep_size = group.size()
        self.num_experts = num_experts
        self.num_local_experts = num_experts // self.ep_size
        self.hidden_size = hidden_size
        self.deepep_mode = deepep_mode
        self.num_max_dispatch_tokens_per_rank = num_max_dispatch_tokens_per_rank
        self.buffer = DeepEPBuffer(group, int(1e9), int(1e9), low_latency_mode=deepep_mode != DeepEPMode.NORMAL)
        self.handle = None
        self.expert_load_history: Deque[List[int]] = deque(maxlen=1000)

    def dispatch(self, hidden_states: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, is_extend: bool) -> DispatchOutput:
        assert topk_idx.dtype == torch.int64, "DeepEP expects int64 expert ids"  # expect: FC109  # ok: FC101
        if self.deepep_mode.resolve(is_extend) == DeepEPMode.NORMAL:
            return self._dispatch_normal(hidden_states, topk_idx, topk_weights)
        return self._dispatch_low_latency(hidden_states, topk_idx, topk_weights)

    def _record_expert_load(self, topk_idx: torch.Tensor) -> None:
        # expert-load statistics for the EPLB rebalancer
        valid = topk_idx >= 0
        local_counts = torch.bincount(topk_idx[valid], minlength=self.num_experts)  # expect: FC101
        self.expert_load_history.append(local_counts.tolist())  # expect: FC101

    def _dispatch_normal(self, hidden_states, topk_idx, topk_weights) -> DispatchOutput:
        self._record_expert_load(topk_idx)
        num_tokens_per_rank, num_tokens_per_rdma_rank, num_tokens_per_expert, is_token_in_rank, _ = self.buffer.get_dispatch_layout(
            topk_idx, self.num_experts
        )
        recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list, self.handle, _ = self.buffer.dispatch(
            hidden_states,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
            num_tokens_per_rank=num_tokens_per_rank,
            num_tokens_per_rdma_rank=num_tokens_per_rdma_rank,
            is_token_in_rank=is_token_in_rank,
            num_tokens_per_expert=num_tokens_per_expert,
            expert_alignment=128,
        )
        return DispatchOutput(recv_x, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list)

    def _dispatch_low_latency(self, hidden_states, topk_idx, topk_weights) -> DispatchOutput:
        recv_hidden, masked_m, self.handle, _, _ = self.buffer.low_latency_dispatch(
            hidden_states, topk_idx, self.num_max_dispatch_tokens_per_rank, self.num_experts, use_fp8=True
        )
        expected_m = math.ceil(hidden_states.shape[0] * topk_idx.shape[1] * self.ep_size / self.num_experts)  # ok: FC101
        return DispatchOutput(recv_hidden, topk_idx, topk_weights, [], masked_m=masked_m, expected_m=expected_m)

    def combine(self, hidden_states: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        if self.handle is None:
            raise RuntimeError("combine() called before dispatch()")
        combined, _, _ = self.buffer.combine(hidden_states, self.handle, topk_weights=topk_weights)
        return combined
