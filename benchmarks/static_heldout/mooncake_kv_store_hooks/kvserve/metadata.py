"""Per-step attention metadata for prefill and decode."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class PrefillMetadata:
    batch_size: int
    num_tokens: int
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor  # device
    kv_last_page_len: torch.Tensor  # device copy the rope/cache-write kernels read
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    last_token_rows: torch.Tensor


@dataclass
class DecodeMetadata:
    batch_size: int
    max_seq_len: int
    req_ids: List[int]
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # pinned
    page_lists: List[np.ndarray]
    block_table: torch.Tensor  # device
    kv_indptr_np: np.ndarray
    kv_last_page_len_np: np.ndarray
    kv_indices: torch.Tensor  # device
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    shared_prefix_pages: int = 0
    use_trtllm: bool = False
    graph_bs: Optional[int] = None
