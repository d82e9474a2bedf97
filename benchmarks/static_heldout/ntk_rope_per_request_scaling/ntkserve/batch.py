"""The per-step batch the scheduler hands to the engine (long rows are ordered last)."""

from dataclasses import dataclass
from typing import List

import numpy as np
import torch


@dataclass
class StepBatch:
    slots: List[int]
    tokens_dev: torch.Tensor
    positions_dev: torch.Tensor
    seq_lens_dev: torch.Tensor
    seq_lens_cpu: torch.Tensor
    slot_index: torch.Tensor
    qo_indptr_np: np.ndarray
    kv_indptr_np: np.ndarray
    kv_indices_np: np.ndarray
    last_page_len_np: np.ndarray
    is_prefill: bool = False
    num_long: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.slots)


def build_step_batch(slots, token_ids, seq_lens, page_tables, page_size, long_threshold, device, is_prefill=False):
    seq_np = np.asarray(seq_lens, dtype=np.int32)
    pages = (seq_np + page_size - 1) // page_size
    kv_indptr = np.zeros(len(slots) + 1, dtype=np.int32)
    np.cumsum(pages, out=kv_indptr[1:])
    kv_indices = np.concatenate([np.asarray(t[:n], dtype=np.int32) for t, n in zip(page_tables, pages)])
    q_lens = np.asarray([len(t) for t in token_ids], dtype=np.int32)
    qo_indptr = np.zeros(len(slots) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qo_indptr[1:])
    flat = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_ids])
    seq_cpu = torch.from_numpy(seq_np)
    return StepBatch(
        slots=list(slots),
        tokens_dev=torch.from_numpy(flat).to(device, non_blocking=True),
        positions_dev=torch.from_numpy(seq_np.astype(np.int64) - 1).to(device, non_blocking=True),
        seq_lens_dev=seq_cpu.to(device, non_blocking=True),
        seq_lens_cpu=seq_cpu,
        slot_index=torch.as_tensor(slots, dtype=torch.int64, device=device),
        qo_indptr_np=qo_indptr,
        kv_indptr_np=kv_indptr,
        kv_indices_np=kv_indices,
        last_page_len_np=(seq_np - (pages - 1) * page_size).astype(np.int32),
        is_prefill=is_prefill,
        num_long=int((seq_np > long_threshold).sum()),
    )
