"""Per-step batch: device tensors and the host mirrors the scheduler built them from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    qo_indptr: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    is_decode: bool = True
    spec_tokens: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return self.seq_lens_cpu.numel()

    @property
    def num_tokens(self) -> int:
        return int(self.qo_indptr_cpu[-1])  # ok: FC101

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())  # expect: FC101
