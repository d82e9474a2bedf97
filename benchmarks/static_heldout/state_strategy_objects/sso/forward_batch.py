"""Per-step batch description shared by the states, the strategies and the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from sso.config import BatchKind


@dataclass
class ForwardBatch:
    kind: BatchKind
    batch_size: int
    num_real_seqs: int
    num_prefills: int
    num_tokens: int
    req_ids: list[str]
    # device tensors
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indices: torch.Tensor
    # host mirrors (pinned), filled by numpy before the upload
    seq_lens_cpu: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    prefix_lens: Optional[torch.Tensor] = None
    prefix_lens_cpu: Optional[torch.Tensor] = None
    min_tokens_mask: Optional[torch.Tensor] = None
    temperatures: Optional[torch.Tensor] = None
    use_graph: bool = False
    logits_indices: Optional[torch.Tensor] = None
    extras: dict = field(default_factory=dict)

    @property
    def is_decode(self) -> bool:
        return self.kind is BatchKind.DECODE


def pinned_from_numpy(arr: np.ndarray) -> torch.Tensor:
    out = torch.empty(arr.shape, dtype=torch.int32, pin_memory=True)
    out.numpy()[...] = arr
    return out
