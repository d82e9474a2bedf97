from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DecodeBatch:
    batch_size: int
    input_ids: torch.Tensor  # device
    positions: torch.Tensor  # device
    seq_lens: torch.Tensor  # device
    seq_lens_np: np.ndarray
    page_table: torch.Tensor  # [bs, max_pages_per_req] device
    page_table_np: np.ndarray
    query_summary: torch.Tensor  # [bs, heads, head_dim] device, last step's pooled query
    key_cache: torch.Tensor  # layer-0 keys, read by the block summary kernel
    max_seq_len: int


@dataclass
class PrefillBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    num_tokens: int
