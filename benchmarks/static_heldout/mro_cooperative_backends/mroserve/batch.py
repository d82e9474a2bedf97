"""Per-step batch description handed from the scheduler to the model runner."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND


@dataclass
class ForwardBatch:
    """Device tensors the kernels read, with pinned ``*_cpu`` twins for ``plan()``.

    The scheduler builds every array on the host first; the device copies are
    uploaded with ``non_blocking=True`` from the pinned twins, so the twins are
    always the authoritative values for host-side decisions.
    """

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    prefix_lens: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_cpu: Optional[torch.Tensor] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    block_tables: Optional[torch.Tensor] = None

    @classmethod
    def from_host(
        cls,
        mode: ForwardMode,
        *,
        input_ids: np.ndarray,
        positions: np.ndarray,
        out_cache_loc: np.ndarray,
        seq_lens: np.ndarray,
        prefix_lens: np.ndarray,
        page_lists: List[np.ndarray],
        page_size: int,
        device: torch.device,
        extend_lens: Optional[np.ndarray] = None,
    ) -> "ForwardBatch":
        def pinned(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).pin_memory()

        def upload(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        bs = len(seq_lens)
        pages_per_req = np.array([len(p) for p in page_lists], dtype=np.int32)
        kv_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_per_req, out=kv_indptr_np[1:])
        kv_indices_np = np.concatenate(page_lists).astype(np.int32) if bs else np.zeros(0, np.int32)
        last_np = ((seq_lens - 1) % page_size + 1).astype(np.int32)

        width = int(pages_per_req.max()) if bs else 0
        block_np = np.zeros((bs, max(width, 1)), dtype=np.int32)
        for i, pages in enumerate(page_lists):
            block_np[i, : len(pages)] = pages

        seq_lens_cpu = pinned(seq_lens.astype(np.int32))
        kv_indptr_cpu = pinned(kv_indptr_np)
        last_cpu = pinned(last_np)
        qo_indptr_cpu = None
        extend_seq_lens = None
        if extend_lens is not None:
            qo_np = np.zeros(bs + 1, dtype=np.int32)
            np.cumsum(extend_lens, out=qo_np[1:])
            qo_indptr_cpu = pinned(qo_np)
            extend_seq_lens = upload(pinned(extend_lens.astype(np.int32)))

        return cls(
            forward_mode=mode,
            batch_size=bs,
            input_ids=upload(pinned(input_ids.astype(np.int64))),
            positions=upload(pinned(positions.astype(np.int64))),
            out_cache_loc=upload(pinned(out_cache_loc.astype(np.int64))),
            seq_lens=upload(seq_lens_cpu),
            seq_lens_cpu=seq_lens_cpu,
            kv_indptr=upload(kv_indptr_cpu),
            kv_indptr_cpu=kv_indptr_cpu,
            kv_indices=upload(pinned(kv_indices_np)),
            kv_last_page_len=upload(last_cpu),
            kv_last_page_len_cpu=last_cpu,
            prefix_lens=upload(pinned(prefix_lens.astype(np.int32))),
            qo_indptr=upload(qo_indptr_cpu) if qo_indptr_cpu is not None else None,
            qo_indptr_cpu=qo_indptr_cpu,
            extend_seq_lens=extend_seq_lens,
            block_tables=upload(pinned(block_np)),
        )
