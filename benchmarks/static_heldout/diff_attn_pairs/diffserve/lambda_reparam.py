"""The re-parameterised lambda of a differential head.

``lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init`` with ``lambda_init`` decaying with depth.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def lambda_init_fn(depth: int, decay: float = 0.3) -> float:
    return 0.8 - 0.6 * math.exp(-decay * depth)


class DiffLambda(nn.Module):
    def __init__(self, head_dim: int, depth: int, decay: float, device: torch.device):
        super().__init__()
        self.lambda_init = lambda_init_fn(depth, decay)
        self.lambda_q1 = nn.Parameter(torch.zeros(head_dim, dtype=torch.float32, device=device).normal_(0, 0.1))
        self.lambda_k1 = nn.Parameter(torch.zeros(head_dim, dtype=torch.float32, device=device).normal_(0, 0.1))
        self.lambda_q2 = nn.Parameter(torch.zeros(head_dim, dtype=torch.float32, device=device).normal_(0, 0.1))
        self.lambda_k2 = nn.Parameter(torch.zeros(head_dim, dtype=torch.float32, device=device).normal_(0, 0.1))

    def forward(self) -> torch.Tensor:
        l1 = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1))
        l2 = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2))
        return l1 - l2 + self.lambda_init

    @property
    def output_scale(self) -> float:
        return 1.0 - self.lambda_init
