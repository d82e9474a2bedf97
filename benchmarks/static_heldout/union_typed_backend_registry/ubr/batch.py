"""The per-step decode batch handed from the runner to the attention backend."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class StepBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.shape[0]

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())  # expect: FC101


def _indptr_np(seq_lens_np: np.ndarray, page_size: int) -> np.ndarray:
    pages = (seq_lens_np + page_size - 1) // page_size
    indptr = np.zeros(len(seq_lens_np) + 1, dtype=np.int32)
    np.cumsum(pages, out=indptr[1:])
    return indptr


def build_step_batch(
    input_ids_np: np.ndarray,
    seq_lens_np: np.ndarray,
    page_table_np: np.ndarray,
    page_size: int,
    device: torch.device,
) -> StepBatch:
    """Everything is computed with numpy and uploaded once; host copies stay beside the device ones."""
    indptr_np = _indptr_np(seq_lens_np, page_size)
    pages = np.diff(indptr_np)
    indices_np = np.concatenate([page_table_np[i, : pages[i]] for i in range(len(pages))]).astype(np.int32)
    last_np = ((seq_lens_np - 1) % page_size + 1).astype(np.int32)

    seq_lens_cpu = torch.from_numpy(seq_lens_np.astype(np.int32))
    kv_indptr_cpu = torch.from_numpy(indptr_np)
    last_cpu = torch.from_numpy(last_np)
    return StepBatch(
        input_ids=torch.from_numpy(input_ids_np).to(device, non_blocking=True),
        positions=(seq_lens_cpu.long() - 1).to(device, non_blocking=True),
        seq_lens=seq_lens_cpu.to(device, non_blocking=True),
        seq_lens_cpu=seq_lens_cpu,
        kv_indptr=kv_indptr_cpu.to(device, non_blocking=True),
        kv_indptr_cpu=kv_indptr_cpu,
        kv_indices=torch.from_numpy(indices_np).to(device, non_blocking=True),
        kv_last_page_len=last_cpu.to(device, non_blocking=True),
        kv_last_page_len_cpu=last_cpu,
    )
