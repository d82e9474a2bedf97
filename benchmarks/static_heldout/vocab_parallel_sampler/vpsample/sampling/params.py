"""Per-row sampling parameters as device tensors (plus the host values the planner needs)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import torch


@dataclass
class SamplingTensors:
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    presence_penalty: torch.Tensor
    # largest top-k of the batch, decided on the host when the batch is formed
    k_cap: int

    @classmethod
    def from_lists(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int],
        top_p: Sequence[float],
        presence: Sequence[float],
        max_k: int,
        device: torch.device,
    ) -> "SamplingTensors":
        ks: List[int] = [k if 0 < k <= max_k else max_k for k in top_k]
        return cls(
            temperature=torch.tensor(temperature, dtype=torch.float32, device=device),
            top_k=torch.tensor(ks, dtype=torch.int32, device=device),
            top_p=torch.tensor(top_p, dtype=torch.float32, device=device),
            presence_penalty=torch.tensor(presence, dtype=torch.float32, device=device),
            k_cap=max(ks) if ks else 1,
        )

    @classmethod
    def static(cls, rows: int, max_k: int, device: torch.device) -> "SamplingTensors":
        return cls(
            temperature=torch.ones(rows, dtype=torch.float32, device=device),
            top_k=torch.full((rows,), max_k, dtype=torch.int32, device=device),
            top_p=torch.ones(rows, dtype=torch.float32, device=device),
            presence_penalty=torch.zeros(rows, dtype=torch.float32, device=device),
            k_cap=max_k,
        )

    def copy_into(self, dst: "SamplingTensors", bs: int) -> None:
        dst.temperature[:bs].copy_(self.temperature[:bs])
        dst.top_k[:bs].copy_(self.top_k[:bs])
        dst.top_p[:bs].copy_(self.top_p[:bs])
        dst.presence_penalty[:bs].copy_(self.presence_penalty[:bs])
