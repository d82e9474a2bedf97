from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


@dataclass
class DecodeRequestBatch:
    """What the scheduler hands the runner every step (host page lists, device token inputs)."""

    req_ids: List[int]
    page_lists: List[np.ndarray]
    last_page_lens: np.ndarray
    input_ids: torch.Tensor
    positions: torch.Tensor
    finished_rows: List[int] = field(default_factory=list)
    new_prompts: List[np.ndarray] = field(default_factory=list)

    @property
    def bs(self) -> int:
        return len(self.req_ids)


@dataclass
class KnnAttnMetadata:
    bs: int
    bucket: int
    nnz: int
    kv_indptr_cpu: torch.Tensor          # pinned, padded to the bucket
    kv_last_page_len_cpu: torch.Tensor   # pinned, padded to the bucket
    kv_indices: torch.Tensor             # device
    seq_lens: torch.Tensor               # device, for the trtllm-gen overflow kernel
    block_tables: torch.Tensor           # device


@dataclass
class PrefillMetadata:
    num_reqs: int
    qo_indptr: torch.Tensor              # device (also used to gather last-token hidden states)
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
