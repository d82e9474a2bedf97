"""M2N token exchange between attention ranks (M) and FFN ranks (N). ``afd.comm`` is a namespace folder."""

from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist

from afd.topology import AFDTopology


class M2NSender:
    def __init__(self, topo: AFDTopology, group: Optional[dist.ProcessGroup], device: torch.device):
        self.topo = topo
        self.group = group
        self.device = device
        self.n_ffn = topo.ffn_ranks
        self.comm_stream = torch.cuda.Stream(device)
        self.router = torch.nn.Linear(topo.hidden_size, topo.num_experts, bias=False, device=device,
                                      dtype=torch.bfloat16)
        self.send_counts = torch.zeros(self.n_ffn, dtype=torch.int64, device=device)
        self.overflow_cpu = torch.zeros(topo.num_microbatches, dtype=torch.int32, pin_memory=True)
        self.recv_buf: Optional[torch.Tensor] = None

    def send_hidden(self, h: torch.Tensor, layer_idx: int) -> List[int]:
        scores = self.router(h).float().softmax(dim=-1)
        topk_w, topk_ids = scores.topk(self.topo.top_k, dim=-1)
        dst = (topk_ids // self.topo.experts_per_rank).flatten()
        self.send_counts.zero_()
        self.send_counts.scatter_add_(0, dst, torch.ones_like(dst))
        counts = self.send_counts.tolist()  # expect: FC101
        order = torch.argsort(dst, stable=True)
        payload = h.repeat_interleave(self.topo.top_k, dim=0)  # ok: FC101
        payload = payload[order]
        with torch.cuda.stream(self.comm_stream):
            dist.all_to_all_single(self._recv_view(sum(counts)), payload, output_split_sizes=None,
                                   input_split_sizes=counts, group=self.group)
        return counts

    def _recv_view(self, n: int) -> torch.Tensor:
        if self.recv_buf is None:
            cap = self.topo.max_mb_size * self.topo.top_k * self.topo.num_microbatches
            self.recv_buf = torch.empty(cap, self.topo.hidden_size, dtype=torch.bfloat16, device=self.device)  # ok: FC107
        return self.recv_buf[:n]

    def exchange(self, h: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """Send the micro-batch's tokens to their experts and wait (on the comm stream) for the combined output."""
        self.send_hidden(h, layer_idx)
        out = torch.empty_like(h)
        with torch.cuda.stream(self.comm_stream):
            dist.all_to_all_single(out, self.recv_buf[: h.shape[0]], group=self.group)
        torch.cuda.current_stream().wait_stream(self.comm_stream)  # ok: FC101
        return out
