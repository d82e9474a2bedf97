"""Reward heads on top of the backbone's hidden states."""

from __future__ import annotations

import torch
import torch.nn as nn


class ScalarRewardHead(nn.Module):
    """Outcome reward: one scalar per sequence from its last token."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1, bias=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden).squeeze(-1).float()


class TokenRewardHead(nn.Module):
    """Process reward: one scalar per response token."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden_size)
        self.proj = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(self.norm(hidden)).squeeze(-1).float())
