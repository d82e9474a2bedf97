from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class TierStepMeta:
    """Per-step page tables, one set per tier, rebuilt on the host and copied up."""

    batch: int
    bf16_indptr_host: torch.Tensor
    bf16_indices: torch.Tensor
    bf16_last_page_len_host: torch.Tensor
    fp8_indptr_host: torch.Tensor
    fp8_indices: torch.Tensor
    fp8_last_page_len: torch.Tensor
    int4_indptr_host: torch.Tensor
    int4_indices: torch.Tensor
    int4_last_page_len_host: torch.Tensor
    tier_ids: torch.Tensor
    dequant_pages: Optional[torch.Tensor] = None
    graph_bs: Optional[int] = None
