"""Confidence head over the hidden state after each layer group."""

import torch
from torch import nn


class ConfidenceHead(nn.Module):
    def __init__(self, hidden: int, threshold: float, num_groups: int):
        super().__init__()
        assert 0.0 < threshold < 1.0  # expect: FC109
        self.threshold = threshold
        self.proj = nn.ModuleList([nn.Linear(hidden, 1) for _ in range(num_groups)])

    def forward(self, h: torch.Tensor, group: int) -> torch.Tensor:
        return torch.sigmoid(self.proj[group](h)).squeeze(-1)

    def should_exit(self, h: torch.Tensor, group: int) -> bool:
        conf = self.forward(h, group)
        return bool((conf > self.threshold).all())  # expect: FC101

    def depth_per_row(self, confs: torch.Tensor, min_depth: int) -> torch.Tensor:
        # confs: [groups, bs]; first group whose confidence passes, at least min_depth
        passed = confs > self.threshold
        passed[:min_depth] = False
        first = torch.argmax(passed.int(), dim=0)
        none = ~passed.any(dim=0)
        return torch.where(none, torch.full_like(first, confs.shape[0] - 1), first) + 1
