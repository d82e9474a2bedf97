from dataclasses import dataclass
from typing import List

import numpy as np
import torch


@dataclass
class HybridBatch:
    req_ids: List[int]
    input_ids: torch.Tensor            # device
    seq_lens: torch.Tensor             # device
    seq_lens_cpu: torch.Tensor
    out_loc: torch.Tensor              # device slot of the new token in the window
    near_indptr_cpu: torch.Tensor
    near_indices: torch.Tensor         # device window page ids
    near_last_cpu: torch.Tensor
    inflight_indptr_cpu: torch.Tensor
    inflight_indices: torch.Tensor
    inflight_last_cpu: torch.Tensor
    far_pages: List[np.ndarray]        # host page ids per row

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)
