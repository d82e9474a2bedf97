"""Step-time models over the KV lengths of a candidate batch."""

from typing import Protocol

import torch


class CostModel(Protocol):
    def estimate(self, kv_lens: torch.Tensor) -> float: ...

    def fits(self, cost_us: float, budget_us: float) -> bool: ...


class LinearCostModel:
    """Decode time grows with the KV tokens read plus a per-row and a fixed cost."""

    def __init__(self, per_token_us: float, per_row_us: float, fixed_us: float):
        self.per_token_us = per_token_us
        self.per_row_us = per_row_us
        self.fixed_us = fixed_us

    def estimate(self, kv_lens: torch.Tensor) -> float:
        return float(self.per_token_us * kv_lens.sum() + self.per_row_us * kv_lens.numel() + self.fixed_us)  # expect: FC101

    def fits(self, cost_us: float, budget_us: float) -> bool:
        return cost_us <= budget_us
