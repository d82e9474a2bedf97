"""A device ring of (target hidden state, accepted token) pairs: the draft's training data."""
from typing import Tuple

import torch
from flashcheck import hot_path


class AcceptedTokenBuffer:
    def __init__(self, capacity: int, hidden_size: int, batch_tokens: int, device: torch.device):
        self.capacity = capacity
        self.batch_tokens = batch_tokens
        self.hidden = torch.zeros(capacity, hidden_size, dtype=torch.bfloat16, device=device)
        self.tokens = torch.zeros(capacity, dtype=torch.int64, device=device)
        self._count = torch.zeros((), dtype=torch.int64, device=device)
        self._head = 0

    @property
    def ready(self) -> bool:
        """Enough new pairs since the last training step."""
        return bool(self._count >= self.batch_tokens)  # expect: FC101

    @hot_path
    def push(self, hidden: torch.Tensor, tokens: torch.Tensor) -> None:
        m = tokens.shape[0]
        first = min(m, self.capacity - self._head)
        self.hidden[self._head : self._head + first].copy_(hidden[:first])
        self.tokens[self._head : self._head + first].copy_(tokens[:first])
        if first < m:
            self.hidden[: m - first].copy_(hidden[first:])
            self.tokens[: m - first].copy_(tokens[first:])
        self._head = (self._head + m) % self.capacity
        self._count.add_(m)
        self._check_ring()

    def _check_ring(self) -> None:
        assert 0 <= self._head < self.capacity  # ok: FC109

    def sample(self, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(0, self.capacity, (n,), device=self.tokens.device)
        return self.hidden[idx], self.tokens[idx]

    def reset_count(self) -> None:
        self._count.zero_()
