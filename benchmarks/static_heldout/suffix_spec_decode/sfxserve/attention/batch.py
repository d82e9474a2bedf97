"""Per-step batch descriptions handed from the engine to attention."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VerifyBatch:
    batch_size: int
    num_tokens: int
    input_ids: torch.Tensor  # [num_tokens] device
    positions: torch.Tensor  # [num_tokens] device
    seq_lens: torch.Tensor  # [bs] device, length after the drafts
    kv_indices: torch.Tensor  # [nnz_pages] device
    kv_last_page_len: torch.Tensor  # [bs] device, read by the eager kernels
    qo_indptr_cpu: torch.Tensor  # [bs + 1] host
    kv_indptr_cpu: torch.Tensor  # [bs + 1] host
    kv_last_page_len_cpu: torch.Tensor  # [bs] host
    max_seq_len: int


@dataclass
class PrefillBatch:
    req_ids: list
    input_ids: torch.Tensor
    positions: torch.Tensor
    prompt_lens: list
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
