"""All-to-all token dispatch / combine over NVSHMEM symmetric buffers.

Receive buffers are sized from the expert capacity, so no rank needs the others' counts on
the host: counts travel device to device and the kernels read them there.
"""
from __future__ import annotations

from typing import Optional

import nvshmem_moe_ext as ext
import torch
import torch.distributed as dist

from .capacity import expert_capacity
from .config import MoEConfig
from .kernels import expert_offsets_kernel


class A2ADispatcher:
    def __init__(self, cfg: MoEConfig, capacity_factor: float, group: Optional[dist.ProcessGroup],
                 scratch: torch.Tensor, device: torch.device):
        assert capacity_factor >= 1.0, "capacity_factor below 1 drops tokens"  # expect: FC109
        self.E, self.top_k, self.world = cfg.num_experts, cfg.top_k, cfg.world_size
        self.hidden = cfg.hidden_size
        self.local_experts = self.E // self.world
        self.capacity_factor = capacity_factor
        self.capacity = expert_capacity(cfg.max_num_tokens, cfg.top_k, cfg.num_experts, capacity_factor)
        self.group = group
        self.handle = ext.get_team_handle(group)
        # int32 scratch borrowed from the attention backend (its indptr is idle between plans;
        # num_experts + 1 <= max_batch_size + 1)
        self.scratch = scratch
        self.send_counts = torch.zeros(self.E, dtype=torch.int32, device=device)
        self.recv_counts = torch.zeros(self.E, dtype=torch.int32, device=device)
        self.send_offsets = torch.zeros(self.E, dtype=torch.int32, device=device)
        self.recv_offsets = torch.zeros(self.E + 1, dtype=torch.int32, device=device)
        self.topk_host = torch.empty(cfg.max_batch_size * cfg.top_k, dtype=torch.int32, pin_memory=True)
        slots = self.world * self.local_experts * self.capacity
        # payload staging only: every slot the combine reads was written by this step's dispatch
        self.dispatch_workspace = torch.empty(slots, self.hidden, dtype=torch.bfloat16, device=device)  # ok: FC105
        self.signal_workspace = torch.empty(self.world * 2, dtype=torch.int64, device=device)  # expect: FC105
        for buf in (self.dispatch_workspace, self.signal_workspace, self.recv_counts):
            ext.register_symmetric(buf, self.handle)  # peers write into these
        self.combine_out = torch.empty(cfg.max_num_tokens, self.hidden, dtype=torch.bfloat16, device=device)
        self._pending_order = torch.empty(cfg.max_num_tokens * cfg.top_k, dtype=torch.int64, device=device)
        self.stats = {"max_recv": 0, "steps": 0}
        self._pending = 0

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        if expert_capacity(n, self.top_k, self.E, self.capacity_factor) > self.capacity:
            raise ValueError(f"{n} tokens need more than the {self.capacity} slots sized at start-up")
        flat = topk_ids.flatten().to(torch.int32)
        self.send_counts.zero_()
        self.send_counts.scatter_add_(0, flat.long(), torch.ones_like(flat))
        expert_offsets_kernel[(1,)](self.send_counts, self.send_offsets, E=self.E, BLOCK=triton_block(self.E))
        torch.cumsum(self.send_counts, 0, out=self.scratch[1 : self.E + 1])  # expect: FC104
        dist.all_to_all_single(self.recv_counts, self.send_counts, group=self.group)
        if (self.recv_counts > self.capacity).any():  # expect: FC101
            raise OverflowError("expert capacity exceeded; raise capacity_factor")
        torch.cumsum(self.recv_counts, 0, out=self.recv_offsets[1:])  # ok: FC104
        order = torch.argsort(flat, stable=True)
        expert_of_slot = torch.repeat_interleave(  # ok: FC101
            torch.arange(self.E, device=x.device), self.send_counts, output_size=n * self.top_k)
        ext.dispatch_tokens(x, order // self.top_k, expert_of_slot, self.scratch[: self.E + 1], self.recv_offsets,
                            self.dispatch_workspace, self.capacity, self.handle)
        need = n * self.top_k
        if self.topk_host.numel() < need:
            self.topk_host = torch.empty(need, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.topk_host[:need].copy_(flat, non_blocking=True)  # expert-load statistics, read by the balancer
        self.stats["max_recv"] = max(self.stats["max_recv"], int(self.recv_counts.max()))  # expect: FC101
        self.stats["steps"] += 1
        self._pending_order[:need].copy_(order)
        self._pending = need
        return self.dispatch_workspace.view(self.local_experts, self.world * self.capacity, self.hidden)

    def combine(self, expert_out: torch.Tensor, topk_weights: torch.Tensor, n: int) -> torch.Tensor:
        assert self._pending > 0, "combine() without a matching dispatch()"  # ok: FC109
        out = self.combine_out[:n]
        ext.combine_tokens(expert_out, self._pending_order[: self._pending], topk_weights, out, self.recv_offsets,
                           workspace=self.signal_workspace, team=self.handle)
        self._pending = 0
        return out


def triton_block(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())
