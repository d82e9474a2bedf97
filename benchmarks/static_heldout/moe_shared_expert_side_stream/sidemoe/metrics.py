"""Expert-load counters for the operator dashboard (pulled by the metrics thread every few seconds)."""

from __future__ import annotations

import torch


class ExpertLoadReporter:
    def __init__(self, num_layers: int, num_experts: int, device: torch.device):
        self.counts = torch.zeros(num_layers, num_experts + 1, dtype=torch.int64, device=device)

    def accumulate(self, layer_id: int, offsets: torch.Tensor) -> None:
        self.counts[layer_id] += offsets.to(torch.int64)

    def snapshot(self) -> dict:
        host = self.counts.cpu()  # ok: FC101
        return {layer: host[layer].diff().tolist() for layer in range(host.shape[0])}
