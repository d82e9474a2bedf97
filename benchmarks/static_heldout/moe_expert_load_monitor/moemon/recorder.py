"""Per-expert token counts, accumulated on the device inside every step (graphs included)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from .monitor import LoadMonitor


class ExpertLoadRecorder:
    def __init__(self, num_layers: int, num_experts: int, export_every: int, device: torch.device, monitor: "LoadMonitor"):
        self.num_layers = num_layers
        self.num_experts = num_experts
        self.export_every = export_every
        self.device = device
        self.monitor = monitor
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.int32, device=device)
        self.host_counts: Optional[torch.Tensor] = None
        self.ready = torch.cuda.Event()
        self.step = 0

    def accumulate(self, layer_id: int, topk_ids: torch.Tensor) -> None:
        flat = topk_ids.flatten()
        self.counts[layer_id].scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))

    def end_step(self) -> None:
        """Every `export_every` steps, hand a snapshot to the monitor thread and start a new window."""
        self.step += 1
        if self.step % self.export_every:
            return
        if not self.counts.any():  # expect: FC101
            return
        if self.host_counts is None:
            self.host_counts = torch.empty(self.counts.shape, dtype=torch.int32, pin_memory=True)  # ok: FC107
        self.host_counts.copy_(self.counts, non_blocking=True)  # ok: FC101
        self.ready.record()
        self.monitor.submit(self.step, self.host_counts, self.ready)
        self.counts = torch.zeros(self.num_layers, self.num_experts, dtype=torch.int32, device=self.device)  # expect: FC107
