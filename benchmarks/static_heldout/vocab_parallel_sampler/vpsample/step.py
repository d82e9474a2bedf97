from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch


@dataclass
class RankStep:
    """One decode step as seen by one TP rank (the host bookkeeping is replicated)."""

    num_rows: int
    input_ids: torch.Tensor  # device
    positions: torch.Tensor  # device
    kv_indices: torch.Tensor  # device
    kv_indptr_cpu: torch.Tensor  # pinned
    last_page_len_cpu: torch.Tensor  # pinned
    seq_lens_cpu: torch.Tensor  # pinned
    page_counts_cpu: torch.Tensor  # pinned
    indptr_list: List[int]
    any_long: bool = False
