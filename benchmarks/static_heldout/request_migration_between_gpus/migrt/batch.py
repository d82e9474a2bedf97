"""The decode batch of one GPU, built from its page table on the host."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np
import torch

from gpumig.page_table import DevicePageTable


@dataclass
class StepBatch:
    rids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_loc: torch.Tensor
    seq_lens_dev: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_host: torch.Tensor
    num_pages: int
    rows: torch.Tensor  # device: page-table row of every batch row
    offsets: Dict[int, int]  # rid -> first slot of its pages in kv_indices

    @property
    def size(self) -> int:
        return len(self.rids)


def _pinned(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).pin_memory()


def build_step_batch(
    rids: Sequence[int], table: DevicePageTable, last_ids: torch.Tensor, device: torch.device
) -> StepBatch:
    pages = [table.pages[r] for r in rids]
    seq = np.array([table.lens[r] for r in rids], dtype=np.int32)
    counts = np.array([len(p) for p in pages], dtype=np.int32)
    indptr = np.zeros(len(rids) + 1, dtype=np.int32)
    np.cumsum(counts, out=indptr[1:])
    flat = np.concatenate([np.asarray(p, np.int32) for p in pages]) if pages else np.zeros(0, np.int32)
    ps = table.page_size
    last = ((seq - 1) % ps + 1).astype(np.int32)
    out_loc = np.array([p[-1] * ps + (s - 1) % ps for p, s in zip(pages, seq)], dtype=np.int64)
    rows = _pinned(np.array([table.rows[r] for r in rids], dtype=np.int64)).to(device, non_blocking=True)
    return StepBatch(
        rids=list(rids),
        input_ids=last_ids.index_select(0, rows),
        positions=_pinned((seq - 1).astype(np.int64)).to(device, non_blocking=True),
        out_loc=_pinned(out_loc).to(device, non_blocking=True),
        seq_lens_dev=_pinned(seq).to(device, non_blocking=True),
        seq_lens_cpu=_pinned(seq),
        kv_indptr_host=_pinned(indptr),
        kv_indices=_pinned(flat).to(device, non_blocking=True),
        kv_last_page_host=_pinned(last),
        num_pages=int(indptr[-1]),
        rows=rows,
        offsets={r: int(indptr[i]) for i, r in enumerate(rids)},
    )


def dummy_batch(bs: int, input_ids: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor) -> StepBatch:
    ones = np.ones(bs, dtype=np.int32)
    return StepBatch(
        rids=list(range(bs)),
        input_ids=input_ids[:bs],
        positions=positions[:bs],
        out_loc=out_loc[:bs],
        seq_lens_dev=torch.ones(bs, dtype=torch.int32, device=input_ids.device),
        seq_lens_cpu=_pinned(ones),
        kv_indptr_host=_pinned(np.arange(bs + 1, dtype=np.int32)),
        kv_indices=torch.zeros(bs, dtype=torch.int32, device=input_ids.device),
        kv_last_page_host=_pinned(ones),
        num_pages=bs,
        rows=torch.arange(bs, device=input_ids.device),
        offsets={},
    )
