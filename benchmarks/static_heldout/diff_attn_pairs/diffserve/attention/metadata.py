from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch


@dataclass
class DiffForwardBatch:
    """Everything one step of the model reads. Device tensors are views of the runner's persistent buffers."""

    batch_size: int
    rids: List[int]
    is_decode: bool
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # pinned mirror
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor  # device, consumed by the kernels
    kv_last_page_cpu: torch.Tensor
    out_cache_loc: torch.Tensor  # device, flat KV slot of every new token
    qo_indptr: Optional[torch.Tensor] = None  # device, extend only
    qo_indptr_cpu: Optional[torch.Tensor] = None
    bucket: Optional[int] = None
    # set by the backend when it plans the step: graph-mode wrappers of the bucket or the eager ones
    branch_wrappers: Dict[str, object] = field(default_factory=dict)
    prefix_cached: bool = False

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
