"""Value head over the last hidden state of each child."""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from mcts.config import SearchConfig

logger = logging.getLogger(__name__)


class ValueScorer(nn.Module):
    def __init__(self, cfg: SearchConfig, hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.head = nn.Sequential(nn.Linear(hidden, hidden // 4), nn.Tanh(), nn.Linear(hidden // 4, 1))
        self.values_pinned = torch.zeros(cfg.max_width, dtype=torch.float32, pin_memory=True)
        self.values_ready = torch.cuda.Event()
        self.solved = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.head(hidden).squeeze(-1))

    def score(self, hidden: torch.Tensor, finished_rows: torch.Tensor) -> None:
        n = hidden.shape[0]
        if getattr(self, "_value_buf", None) is None:
            self._value_buf = torch.zeros(self.cfg.max_width, dtype=torch.float32, device=self.device)  # ok: FC107
        v = self._value_buf[:n]
        v.copy_(self(hidden))
        # finished children keep their value; the reward model re-scores them later
        v.index_fill_(0, finished_rows.flatten(), 1.0)
        if (v > self.cfg.solve_threshold).any():  # expect: FC101
            self.solved = True
        self.values_pinned[:n].copy_(v, non_blocking=True)  # ok: FC101
        self.values_ready.record()

    def collect(self, n: int) -> list:
        """Host values of the last ``score``; called by the search loop between expansions."""
        self.values_ready.synchronize()
        return self.values_pinned[:n].tolist()
