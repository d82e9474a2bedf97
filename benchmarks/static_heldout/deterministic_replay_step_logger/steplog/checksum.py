"""A cheap, order-sensitive checksum of a step's logits, computed on the device."""

from __future__ import annotations

from typing import Optional

import torch


@torch.jit.script
def fold_checksum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    assert x.dim() == 2  # ok: FC109
    rows = torch.arange(1, x.size(0) + 1, device=x.device, dtype=x.dtype)
    return ((x * w[: x.size(1)]).sum(dim=1) * rows).sum()


class Checksummer:
    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self.weights: Optional[torch.Tensor] = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.weights is None:
            self.weights = torch.linspace(1.0, 2.0, self.vocab_size, device=self.device)  # ok: FC107
        return fold_checksum(logits.float(), self.weights)
