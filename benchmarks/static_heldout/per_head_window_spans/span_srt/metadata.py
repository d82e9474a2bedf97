from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper


@dataclasses.dataclass
class GroupMetadata:
    """Page lists of one head group for one step."""

    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor
    indices_np: np.ndarray
    first_page_np: np.ndarray
    kv_indices: Optional[torch.Tensor] = None


@dataclasses.dataclass
class SpanForwardMetadata:
    groups: List[GroupMetadata]
    local_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper]
    global_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper]
    prefill_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper]


@dataclasses.dataclass
class GroupGraphBuffers:
    """Persistent buffers the graph-mode wrappers of one local group are bound to, with the
    pinned mirrors the replay plans from."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    last_page_len_cpu: torch.Tensor

    @classmethod
    def allocate(cls, max_bs: int, max_pages: int, device: torch.device) -> "GroupGraphBuffers":
        return cls(
            kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            kv_indices=torch.zeros(max_bs * max_pages, dtype=torch.int32, device=device),
            last_page_len=torch.ones(max_bs, dtype=torch.int32, device=device),
            kv_indptr_cpu=torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True),
            last_page_len_cpu=torch.ones(max_bs, dtype=torch.int32, pin_memory=True),
        )
