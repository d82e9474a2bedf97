"""Splitting a decode step into ping-pong micro-batches (host side)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

import numpy as np
import torch


@dataclass
class DecodeRow:
    rid: str
    token: int
    seq_len: int  # including the token of this step
    pages: List[int]


@dataclass
class MicroBatch:
    index: int
    size: int
    bucket: Optional[int]  # None: larger than every captured bucket
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    seq_lens_list: List[int]
    kv_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor  # device copy for the append kernels
    kv_indices: torch.Tensor
    last_page_cpu: torch.Tensor


def _bucket_for(n: int, buckets: Sequence[int]) -> Optional[int]:
    i = bisect.bisect_left(buckets, n)
    return buckets[i] if i < len(buckets) else None


def split_microbatches(
    rows: Sequence[DecodeRow], num_mb: int, buckets: Sequence[int], page_size: int, device: torch.device
) -> Iterator[MicroBatch]:
    assert num_mb in (2, 3), "the ping-pong schedule is built for two or three micro-batches"  # expect: FC109
    for i, part in enumerate(np.array_split(np.arange(len(rows)), num_mb)):
        mb_rows = [rows[j] for j in part]
        n = len(mb_rows)
        lens = np.asarray([r.seq_len for r in mb_rows], dtype=np.int64)
        counts = -(-lens // page_size)
        indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.concatenate([np.asarray(r.pages[:c], dtype=np.int32) for r, c in zip(mb_rows, counts)])
        last = (lens - (counts - 1) * page_size).astype(np.int32)
        pos = lens - 1
        slots = np.asarray([r.pages[p // page_size] * page_size + p % page_size for r, p in zip(mb_rows, pos)])
        yield MicroBatch(
            index=i,
            size=n,
            bucket=_bucket_for(n, buckets),
            input_ids=torch.tensor([r.token for r in mb_rows], dtype=torch.int64).to(device, non_blocking=True),
            positions=torch.from_numpy(pos).to(device, non_blocking=True),
            slots=torch.from_numpy(slots.astype(np.int64)).to(device, non_blocking=True),
            seq_lens_list=lens.tolist(),
            kv_indptr_cpu=torch.from_numpy(indptr).pin_memory(),
            kv_indptr=torch.from_numpy(indptr).to(device, non_blocking=True),
            kv_indices=torch.from_numpy(indices).to(device, non_blocking=True),
            last_page_cpu=torch.from_numpy(last).pin_memory(),
        )
