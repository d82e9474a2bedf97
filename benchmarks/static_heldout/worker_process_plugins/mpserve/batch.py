"""Per-step inputs the worker builds from the shared-memory mirror."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepMessage:
    """What the driver sends over the pipe; the arrays live in shared memory."""

    step_id: int
    batch_size: int
    num_tokens: int
    is_decode: bool


@dataclass
class StepInputs:
    batch_size: int
    num_tokens: int
    is_decode: bool
    token_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_host: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_host: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_host: torch.Tensor
