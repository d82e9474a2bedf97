"""Per-step forward batch."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import numpy as np
import torch


@dataclasses.dataclass
class Schedule:
    token_ids: np.ndarray
    positions: np.ndarray
    query_lens: np.ndarray
    seq_lens: np.ndarray
    page_tables: List[np.ndarray]
    num_prefill: int


@dataclasses.dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    kv_indices: torch.Tensor        # device copy, checked against the remap table
    pages_per_row: torch.Tensor     # device, for the indptr the KV-append kernel reads
    seq_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    num_prefill: int
    batch_size: int
    last_page_len: Optional[torch.Tensor] = None

    @classmethod
    def from_schedule(cls, sched: Schedule, page_size: int, device: torch.device) -> "ForwardBatch":
        bs = len(sched.seq_lens)
        qo = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(sched.query_lens, out=qo[1:])
        counts = np.array([len(t) for t in sched.page_tables], dtype=np.int32)
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.concatenate(sched.page_tables).astype(np.int32) if bs else np.zeros(0, np.int32)
        last = ((sched.seq_lens - 1) % page_size + 1).astype(np.int32)
        ret = cls(
            input_ids=torch.from_numpy(sched.token_ids).to(device, non_blocking=True),
            positions=torch.from_numpy(sched.positions).to(device, non_blocking=True),
            kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
            pages_per_row=torch.from_numpy(counts).to(device, non_blocking=True),
            seq_lens_cpu=torch.from_numpy(sched.seq_lens),
            qo_indptr_cpu=torch.from_numpy(qo),
            kv_indptr_cpu=torch.from_numpy(indptr),
            kv_indices_cpu=torch.from_numpy(indices),
            last_page_len_cpu=torch.from_numpy(last),
            num_prefill=sched.num_prefill,
            batch_size=bs,
        )
        # the KV-append kernel reads the last-page lengths on the device
        ret.last_page_len = ret.last_page_len_cpu.to(device, non_blocking=True)
        return ret
