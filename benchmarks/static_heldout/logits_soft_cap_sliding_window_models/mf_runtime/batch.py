"""A decode batch of one family: device inputs beside the host tensors the planners read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from mfserve import FamilySpec, RowState


@dataclass
class FamilyBatch:
    family: str
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    window_kv_indices: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.seq_lens_cpu.numel()


def build_family_batch(rows: List[RowState], spec: FamilySpec, page_size: int, device: torch.device) -> FamilyBatch:
    seq = np.array([len(r.tokens) for r in rows], dtype=np.int32)
    pages = (seq + page_size - 1) // page_size
    indptr = np.concatenate(([0], np.cumsum(pages))).astype(np.int32)
    indices = np.concatenate([r.pages[:p] for r, p in zip(rows, pages)]).astype(np.int32)
    if spec.window:
        first = np.maximum(seq - spec.window, 0) // page_size
        w_indices = np.concatenate([r.pages[f:p] for r, f, p in zip(rows, first, pages)]).astype(np.int32)
    else:
        w_indices = indices
    seq_cpu = torch.from_numpy(seq)
    return FamilyBatch(
        family=spec.name,
        input_ids=torch.tensor([r.tokens[-1] for r in rows], dtype=torch.int64).to(device, non_blocking=True),
        positions=(seq_cpu.long() - 1).to(device, non_blocking=True),
        seq_lens=seq_cpu.to(device, non_blocking=True),
        seq_lens_cpu=seq_cpu,
        kv_indptr_cpu=torch.from_numpy(indptr),
        kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
        last_page_len_cpu=torch.from_numpy(((seq - 1) % page_size + 1).astype(np.int32)),
        window_kv_indices=torch.from_numpy(w_indices).to(device, non_blocking=True),
    )
