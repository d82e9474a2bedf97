"""The per-step batch handed to attention and to every logits processor."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import torch


@dataclass
class StepBatch:
    num_rows: int
    rids: List[int]
    last_tokens: torch.Tensor  # device: tokens sampled by the previous step
    positions: torch.Tensor  # device
    kv_indptr: torch.Tensor  # device copy, for the eager wrapper past the buckets
    kv_indices: torch.Tensor  # device
    last_page_len: torch.Tensor  # device
    kv_indptr_cpu: torch.Tensor  # pinned
    last_page_len_cpu: torch.Tensor  # pinned
    indptr_list: List[int]
    last_page_list: List[int]
    long_rows: List[int] = field(default_factory=list)
    rollback_rows: List[int] = field(default_factory=list)


@dataclass
class HostPageMeta:
    indptr: List[int]
    indices: List[int]
    last_page_len: List[int]
    out_pages: List[int]
    out_offsets: List[int]
