"""Attention metadata of one decode or verify step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class DecodeMeta:
    batch_size: int
    num_tokens: int
    max_seq_len: int
    is_verify: bool
    seq_lens: torch.Tensor  # [bs] int32, device; a request the sampler finished on the device reads 0
    seq_lens_cpu: torch.Tensor  # [bs] int32, pinned (as scheduled)
    row_ids: torch.Tensor  # [bs] int64, device
    page_lists: List[np.ndarray]  # host pages per request
    block_table: torch.Tensor  # [bs, max_pages] int32, device (trtllm-gen)
    kv_indices: torch.Tensor  # [total_pages] int32, device
    kv_indptr_host: torch.Tensor  # [bs + 1] int32, host
    kv_last_page_len_host: torch.Tensor  # [bs] int32, host
    qo_indptr_host: torch.Tensor  # [bs + 1] int32, host
    graph_bs: Optional[int] = None
