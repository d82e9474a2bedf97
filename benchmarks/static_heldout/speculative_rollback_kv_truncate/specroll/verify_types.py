"""Per-step verify inputs and outputs."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass
class VerifyBatch:
    draft_tokens: torch.Tensor     # [bs, k] on the device, from the draft graphs
    draft_lens: torch.Tensor       # [bs] drafts per row, on the device
    draft_lens_cpu: torch.Tensor   # the same on the host (the engine decides them)
    kv_indptr_cpu: torch.Tensor
    kv_indices_cpu: torch.Tensor
    last_len_cpu: torch.Tensor
    batch_size: int
    positions: Optional[torch.Tensor] = None

    @property
    def num_draft_tokens(self) -> int:
        return int(self.draft_lens.sum())  # expect: FC101


@dataclasses.dataclass
class VerifyOutput:
    accept_counts: torch.Tensor    # [bs] accepted drafts per row, on the device
    num_rejected: torch.Tensor     # [bs] rejected drafts per row, on the device
    next_tokens: torch.Tensor      # [bs] the bonus / correction token
