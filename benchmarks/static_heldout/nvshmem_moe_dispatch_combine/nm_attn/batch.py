from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class StepBatch:
    input_ids: torch.Tensor
    out_loc: torch.Tensor
    seq_lens_np: np.ndarray
    page_lists: List[List[int]]
    # prefill only
    cu_seqlens_gpu: Optional[torch.Tensor] = None
    kv_indptr_host: Optional[torch.Tensor] = None
    kv_indices: Optional[torch.Tensor] = None
    kv_last_host: Optional[torch.Tensor] = None

    @property
    def batch_size(self) -> int:
        return len(self.page_lists)
