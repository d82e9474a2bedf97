"""Thinking-token budgets and counters, on the device (for the sampler) and on the host (for the scheduler)."""
from __future__ import annotations

import numpy as np
import torch

from reasoning.config import ReasoningConfig


class BudgetTracker:
    def __init__(self, cfg: ReasoningConfig, device: torch.device):
        n = cfg.max_running
        self.cfg = cfg
        self.end_token = cfg.think_end_token
        self.think_budget = torch.zeros(n, dtype=torch.int32, device=device)
        self.think_used = torch.zeros(n, dtype=torch.int32, device=device)
        self.in_thinking = torch.zeros(n, dtype=torch.bool, device=device)
        self.pending_end = torch.zeros(n, dtype=torch.bool, device=device)
        self.finished = torch.zeros(n, dtype=torch.bool, device=device)
        self.budget_np = np.zeros(n, dtype=np.int32)
        self.used_np = np.zeros(n, dtype=np.int32)
        self._initialized = True

    def _check_ready(self) -> None:
        assert self._initialized, "BudgetTracker used before construction finished"  # ok: FC109

    def admit(self, row: int, budget: int) -> None:
        assert budget > 0, "thinking budget must be positive"  # expect: FC109
        self._check_ready()
        self.budget_np[row] = budget
        self.used_np[row] = 0
        self.think_budget[row] = budget
        self.think_used[row] = 0
        self.in_thinking[row] = True
        self.finished[row] = False

    @property
    def any_exhausted(self) -> bool:
        return bool(self.pending_end.any())  # expect: FC101

    def update(self, sampled: torch.Tensor, bs: int) -> None:
        if bs > self.think_used.shape[0]:
            extra = bs - self.think_used.shape[0]
            self.think_used = torch.cat([self.think_used, self.think_used.new_zeros(extra)])  # expect: FC107
        active = self.in_thinking[:bs]
        self.think_used[:bs] += active.to(torch.int32)  # ok: FC104
        self.used_np[:bs] += 1
        exhausted = active & (self.think_used[:bs] >= self.think_budget[:bs])
        rows = exhausted.nonzero().squeeze(1)  # expect: FC101
        self.pending_end[rows] = True
        self.in_thinking[:bs] &= sampled != self.end_token
        self.finished[:bs] |= sampled == self.cfg.vocab_size - 1
