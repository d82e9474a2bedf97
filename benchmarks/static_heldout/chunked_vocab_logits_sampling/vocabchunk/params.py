"""Sampling parameters per request and their per-step tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence

import torch


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0  # 0 or above the engine's limit: the limit
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Dict[int, float] = field(default_factory=dict)


def _device_vec(vals: List[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(vals, dtype=dtype).pin_memory().to(device, non_blocking=True)


@dataclass
class SamplingTensors:
    temperature: torch.Tensor
    top_k: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], max_top_k: int, device: torch.device) -> "SamplingTensors":
        return cls(
            temperature=_device_vec([max(p.temperature, 1e-5) for p in params], torch.float32, device),
            top_k=_device_vec([p.top_k if 0 < p.top_k <= max_top_k else max_top_k for p in params], torch.int32, device),
            presence_penalty=_device_vec([p.presence_penalty for p in params], torch.float32, device),
            frequency_penalty=_device_vec([p.frequency_penalty for p in params], torch.float32, device),
        )

    @classmethod
    def static(cls, max_bs: int, max_top_k: int, device: torch.device) -> "SamplingTensors":
        return cls(
            temperature=torch.ones(max_bs, dtype=torch.float32, device=device),
            top_k=torch.full((max_bs,), max_top_k, dtype=torch.int32, device=device),
            presence_penalty=torch.zeros(max_bs, dtype=torch.float32, device=device),
            frequency_penalty=torch.zeros(max_bs, dtype=torch.float32, device=device),
        )

    def rows(self, n: int) -> "SamplingTensors":
        return SamplingTensors(self.temperature[:n], self.top_k[:n], self.presence_penalty[:n], self.frequency_penalty[:n])

    def load_(self, other: "SamplingTensors", n: int) -> None:
        self.temperature[:n].copy_(other.temperature, non_blocking=True)
        self.top_k[:n].copy_(other.top_k, non_blocking=True)
        self.presence_penalty[:n].copy_(other.presence_penalty, non_blocking=True)
        self.frequency_penalty[:n].copy_(other.frequency_penalty, non_blocking=True)


@dataclass
class PenaltyEntries:
    """Sparse (row, token) logit adjustments: history counts for penalties, constants for logit bias."""

    rows: torch.Tensor
    token_ids: torch.Tensor
    counts: torch.Tensor
    bias: torch.Tensor

    @staticmethod
    def concat(parts: Sequence["PenaltyEntries"]) -> "PenaltyEntries":
        return PenaltyEntries(
            rows=torch.cat([p.rows for p in parts]),
            token_ids=torch.cat([p.token_ids for p in parts]),
            counts=torch.cat([p.counts for p in parts]),
            bias=torch.cat([p.bias for p in parts]),
        )


def penalty_deltas(t: SamplingTensors, pen: PenaltyEntries) -> torch.Tensor:
    presence = t.presence_penalty.index_select(0, pen.rows)
    frequency = t.frequency_penalty.index_select(0, pen.rows)
    return pen.bias - presence * (pen.counts > 0).to(pen.counts.dtype) - frequency * pen.counts
