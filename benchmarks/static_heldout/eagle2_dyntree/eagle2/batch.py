"""Per-step batch for speculative decoding: device tensors for the kernels, pinned mirrors for the planners."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, List

import torch


@dataclass
class SpecForwardBatch:
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indices: torch.Tensor
    draft_kv_indices: torch.Tensor
    block_tables: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_seq_len_cpu: int
    kv_cache: Any
    draft_kv_cache: Any
    cu_accept_lens: torch.Tensor = None

    @classmethod
    def build(cls, seq_lens: List[int], page_rows: List[List[int]], draft_page_rows: List[List[int]],
              kv_cache, draft_kv_cache, device: torch.device) -> "SpecForwardBatch":
        def dev(x, dtype=torch.int32):
            return torch.tensor(x, dtype=dtype, pin_memory=True).to(device, non_blocking=True)

        width = max(len(r) for r in page_rows)
        return cls(
            batch_size=len(seq_lens),
            seq_lens=dev(seq_lens),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32, pin_memory=True),
            kv_indices=dev(list(itertools.chain.from_iterable(page_rows))),
            draft_kv_indices=dev(list(itertools.chain.from_iterable(draft_page_rows))),
            block_tables=dev([r + [0] * (width - len(r)) for r in page_rows]),
            cu_seq_lens=dev(list(itertools.accumulate(seq_lens, initial=0))),
            max_seq_len_cpu=max(seq_lens),
            kv_cache=kv_cache,
            draft_kv_cache=draft_kv_cache,
        )
