from __future__ import annotations

import dataclasses
from typing import List

import numpy as np
import torch


@dataclasses.dataclass
class Seq:
    seq_id: int
    row: int
    length: int
    last_token: int


@dataclasses.dataclass
class StepBatch:
    size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    rows_np: np.ndarray
    lens_np: np.ndarray

    @classmethod
    def from_seqs(cls, seqs: List[Seq], device: torch.device) -> "StepBatch":
        lens_np = np.array([s.length for s in seqs], dtype=np.int32)
        return cls(
            size=len(seqs),
            input_ids=torch.tensor([s.last_token for s in seqs], dtype=torch.int64, device=device),
            positions=torch.tensor(lens_np - 1, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(lens_np, dtype=torch.int32, device=device),
            rows_np=np.array([s.row for s in seqs], dtype=np.int64),
            lens_np=lens_np,
        )
