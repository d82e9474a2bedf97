"""All-to-all token dispatch for expert parallelism.

Decode steps use a fixed capacity per expert (``capacity_factor`` x the uniform share), so every rank sends the
same number of slots to every other rank and the split sizes are known on the host.  Prefill steps run dropless:
the per-rank counts are exchanged first and the variable split sizes are read back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ep_kernels import a2a_ops


@dataclass
class DispatchResult:
    recv_hidden: torch.Tensor
    recv_expert_ids: torch.Tensor
    recv_weights: torch.Tensor
    src_index: torch.Tensor
    src_weights: torch.Tensor
    input_splits: List[int]
    output_splits: List[int]
    a2a_recv: Optional[torch.Tensor] = None


class AllToAllDispatcher:
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        ep_size: int,
        rank: int,
        capacity_factor: float,
        max_tokens: int,
        device: torch.device,
        group: Optional[dist.ProcessGroup] = None,
    ):
        assert num_experts % ep_size == 0  # expect: FC109
        self.num_experts = num_experts
        self.top_k = top_k
        self.ep_size = ep_size
        self.rank = rank
        self.capacity_factor = capacity_factor
        self.group = group
        self.device = device
        self.experts_per_rank = num_experts // ep_size
        self.expert_to_rank = torch.arange(num_experts, device=device) // self.experts_per_rank
        self.token_arange = torch.arange(max_tokens * top_k, device=device)
        self.load_counter = torch.zeros(num_experts, dtype=torch.int64, device=device)
        self.counts_host = torch.zeros(ep_size, dtype=torch.int64, pin_memory=True)
        self._backend = "nccl" if group is None else "custom"
        self.max_tokens = max_tokens
        self._check_routing()
        # NVSHMEM-style scratch for the low-latency kernels; the extension keeps its own handle
        scratch_workspace = torch.empty(64 << 20, dtype=torch.uint8, device=device)  # ok: FC106
        a2a_ops.register_scratch(scratch_workspace, rank, ep_size)

    def _check_routing(self) -> None:
        assert self.expert_to_rank.numel() == self.num_experts  # ok: FC109

    def _capacity(self, num_tokens: int) -> int:
        return max(1, math.ceil(self.capacity_factor * num_tokens * self.top_k / self.num_experts))  # ok: FC101

    def _apply_capacity(self, flat_expert: torch.Tensor, capacity: int) -> torch.Tensor:
        # position of every routed copy inside its expert's queue, in token order
        one_hot = F.one_hot(flat_expert, self.num_experts)
        pos_in_expert = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1
        within = pos_in_expert < capacity
        slot = torch.where(within, flat_expert * capacity + pos_in_expert, -1)  # ok: FC101
        copy_idx = self.token_arange[: flat_expert.numel()]
        return torch.stack([copy_idx, slot], dim=1)[within]  # expect: FC101

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, dropless: bool) -> DispatchResult:
        num_tokens, dim = hidden.shape
        flat_expert = topk_ids.reshape(-1)
        flat_weight = topk_weights.reshape(-1)
        self.load_counter.index_add_(0, flat_expert, torch.ones_like(flat_expert))
        if dropless:
            dest_rank = self.expert_to_rank[flat_expert]
            order = torch.argsort(dest_rank, stable=True)
            counts = torch.bincount(dest_rank, minlength=self.ep_size)
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            splits = torch.cat([counts, recv_counts]).tolist()  # expect: FC101
            input_splits, output_splits = splits[: self.ep_size], splits[self.ep_size :]
            send = hidden[order // self.top_k]
            send_experts = flat_expert[order]
            src_index = order // self.top_k
            src_weights = flat_weight[order]
        else:
            capacity = self._capacity(num_tokens)
            kept = self._apply_capacity(flat_expert, capacity)
            slots = capacity * self.num_experts
            send = hidden.new_zeros((slots, dim))
            send_experts = torch.full((slots,), -1, dtype=flat_expert.dtype, device=hidden.device)
            send[kept[:, 1]] = hidden[kept[:, 0] // self.top_k]
            send_experts[kept[:, 1]] = flat_expert[kept[:, 0]]
            src_index = torch.full((slots,), -1, dtype=torch.int64, device=hidden.device)
            src_index[kept[:, 1]] = kept[:, 0] // self.top_k
            src_weights = torch.zeros(slots, dtype=flat_weight.dtype, device=hidden.device)
            src_weights[kept[:, 1]] = flat_weight[kept[:, 0]]
            input_splits = [capacity * self.experts_per_rank] * self.ep_size
            output_splits = list(input_splits)
        total_recv = sum(output_splits)  # ok: FC101
        result = DispatchResult(
            recv_hidden=send,
            recv_expert_ids=send_experts,
            recv_weights=src_weights,
            src_index=src_index,
            src_weights=src_weights,
            input_splits=input_splits,
            output_splits=output_splits,
        )
        result.a2a_recv = torch.empty((total_recv, dim), dtype=hidden.dtype, device=hidden.device)  # ok: FC107
        recv_experts = torch.empty(total_recv, dtype=send_experts.dtype, device=hidden.device)
        dist.all_to_all_single(result.a2a_recv, send, output_splits, input_splits, group=self.group)
        dist.all_to_all_single(recv_experts, send_experts, output_splits, input_splits, group=self.group)
        result.recv_expert_ids = recv_experts
        return result

    def combine(self, expert_out: torch.Tensor, res: DispatchResult, num_tokens: int) -> torch.Tensor:
        back = torch.empty_like(res.recv_hidden)
        dist.all_to_all_single(back, expert_out, res.input_splits, res.output_splits, group=self.group)
        out = back.new_zeros((num_tokens, back.shape[1]))
        valid = (res.src_index.clamp(min=0), res.src_weights.to(back.dtype))
        out.index_add_(0, valid[0], back * valid[1][:, None])
        return out

    def resize_group(self, new_ep_size: int, group: Optional[dist.ProcessGroup]) -> None:
        # elastic EP: a rank joined or left; the routing table and host counters follow the new world size
        self.ep_size = new_ep_size
        self.group = group
        self.experts_per_rank = self.num_experts // new_ep_size
        self.expert_to_rank.copy_(torch.arange(self.num_experts, device=self.device) // self.experts_per_rank)
        if self.counts_host.numel() != new_ep_size:
            self.counts_host = torch.zeros(new_ep_size, dtype=torch.int64, pin_memory=True)  # ok: FC107

    def report_expert_load(self) -> Dict[int, int]:
        """Polled by the metrics exporter every few seconds."""
        if self._backend == "custom":  # ok: FC103
            a2a_ops.flush_counters()
        return {e: n for e, n in enumerate(self.load_counter.tolist())}  # ok: FC101
