"""A sampler hook that forces the end-of-thinking token once a request's budget runs out."""
from __future__ import annotations

from typing import Optional, Protocol

import torch

from reasoning.budget import BudgetTracker


class SamplerHook(Protocol):
    def __call__(self, logits: torch.Tensor, sampled: torch.Tensor, bs: int) -> torch.Tensor: ...


class ThinkingBudgetHook:
    def __init__(self, tracker: BudgetTracker, vocab_size: int, max_rows: int, device: torch.device):
        self.tracker = tracker
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.device = device
        self.end_token_id = tracker.end_token
        self.end_ids: Optional[torch.Tensor] = None

    def _validate_token(self, tok: int) -> None:
        assert 0 <= tok < self.vocab_size, f"end-of-thinking token {tok} is outside the vocabulary"  # expect: FC109

    def set_end_token(self, token_id: int) -> None:
        self._validate_token(token_id)
        self.end_token_id = token_id
        self.end_ids = None

    def __call__(self, logits: torch.Tensor, sampled: torch.Tensor, bs: int) -> torch.Tensor:
        if self.end_ids is None:
            self.end_ids = torch.full((self.max_rows,), self.end_token_id, dtype=torch.int64, device=self.device)  # ok: FC107
        if not self.tracker.any_exhausted:
            return sampled
        pending = self.tracker.pending_end[:bs]
        forced = torch.where(pending, self.end_ids[:bs], sampled)  # ok: FC101
        self.tracker.in_thinking[:bs] &= ~pending
        pending.zero_()
        return forced
