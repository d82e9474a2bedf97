"""MoE block that overlaps the shared expert (side stream) with the routed experts (main stream)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from sidemoe.batch import ForwardBatch
from sidemoe.config import ServeConfig
from sidemoe.moe.experts import RoutedExperts, SharedExpertMLP
from sidemoe.moe.router import TopKRouter
from sidemoe.streams import SideStreamPair


@dataclasses.dataclass
class ExpertStepPlan:
    num_tokens: int
    inline: bool


class SharedExpertOverlap(nn.Module):
    def __init__(self, cfg: ServeConfig, layer_id: int, streams: SideStreamPair, device: torch.device):
        super().__init__()
        self.layer_id = layer_id
        self.hidden_size = cfg.hidden_size
        self.num_experts = cfg.num_experts
        self.max_tokens = cfg.max_num_tokens
        self.inline_below = cfg.inline_shared_below
        self.overlap = cfg.overlap_shared_expert
        self.device = device
        self.streams = streams
        self.router = TopKRouter(cfg.hidden_size, cfg.num_experts, cfg.top_k)
        self.shared = SharedExpertMLP(cfg.hidden_size, cfg.shared_intermediate)
        self.routed = RoutedExperts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate, cfg.top_k)
        self.expert_offsets = torch.zeros(cfg.num_experts + 1, dtype=torch.int32, device=device)
        self.side_hidden = None

    def prepare_step(self, fb: ForwardBatch) -> None:
        """Decide, before the step, whether the shared expert runs inline or on the side stream."""
        num_tokens = int(fb.input_ids.numel())  # ok: FC101
        self._plan_info = ExpertStepPlan(num_tokens=num_tokens, inline=num_tokens < self.inline_below)  # ok: FC103
        self.expert_offsets = torch.zeros(self.num_experts + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        if self.side_hidden is None:
            self.side_hidden = torch.empty(self.max_tokens, self.hidden_size, dtype=torch.bfloat16, device=self.device)  # ok: FC107

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        assert hidden.shape[-1] == self.hidden_size  # expect: FC109
        step = self._plan_info  # ok: FC103
        topk_w, topk_ids = self.router(hidden)
        if step.inline or not self.overlap:
            return self.shared(hidden) + self.routed(hidden, topk_w, topk_ids, self.expert_offsets)
        n = hidden.shape[0]
        staged = self.side_hidden[:n]
        staged.copy_(hidden)
        self.streams.fork()
        with torch.cuda.stream(self.streams.side_stream):
            shared_out = self.shared(staged)
        torch.cuda.nvtx.range_push(f"routed L{self.layer_id} prev_tokens={self.expert_offsets[-1]}")  # expect: FC101
        routed_out = self.routed(hidden, topk_w, topk_ids, self.expert_offsets)
        torch.cuda.nvtx.range_pop()
        self.streams.join()
        return routed_out + shared_out
