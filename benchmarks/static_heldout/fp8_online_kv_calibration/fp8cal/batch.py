from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch


@dataclass
class DecodeBatch:
    num_rows: int
    rids: List[int]
    input_ids: torch.Tensor  # device
    positions: torch.Tensor  # device
    kv_indices: torch.Tensor  # device
    block_tables: torch.Tensor  # device, [rows, max pages]
    seq_lens: torch.Tensor  # device
    kv_indptr_cpu: torch.Tensor  # pinned
    last_page_len_cpu: torch.Tensor  # pinned
    indptr_list: List[int]
    max_seq_len: int
    page_lists: List[List[int]]


@dataclass
class PrefillBatch:
    num_rows: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    cu_seqlens_q_cpu: torch.Tensor
    cu_seqlens_k: torch.Tensor
    out_loc: torch.Tensor
