"""How many draft nodes each request may grow this step."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class TokenBudget:
    total_tokens: int
    max_per_request: int
    min_per_request: int = 2

    def per_request_cap(self, num_requests: int) -> int:
        assert num_requests > 0  # expect: FC109
        return min(self.max_per_request, max(self.min_per_request, self.total_tokens // num_requests))

    def split(self, accept_rate, num_requests: int) -> np.ndarray:
        """Share the step's draft nodes in proportion to each request's recent acceptance rate."""
        cap = self.per_request_cap(num_requests)
        raw = accept_rate * cap
        shares = np.array([math.ceil(r) for r in raw], dtype=np.int64)  # expect: FC101
        shares = np.clip(shares, self.min_per_request, cap)
        over = int(shares.sum()) - self.total_tokens
        while over > 0:
            i = int(np.argmax(shares))
            if shares[i] <= self.min_per_request:
                break
            take = min(over, int(shares[i]) - self.min_per_request)
            shares[i] -= take
            over -= take
        return shares

    def unused(self, shares: np.ndarray) -> int:
        return max(0, self.total_tokens - int(shares.sum()))
