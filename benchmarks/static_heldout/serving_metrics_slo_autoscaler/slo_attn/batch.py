from dataclasses import dataclass
from typing import List

import torch


@dataclass
class DecodeBatch:
    req_ids: List[int]
    input_ids: torch.Tensor          # device
    out_loc: torch.Tensor            # device
    seq_lens: torch.Tensor           # device
    seq_lens_cpu: torch.Tensor
    page_counts: torch.Tensor        # device
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor         # device
    last_page_len_cpu: torch.Tensor
    active_mask: torch.Tensor        # device bool: rows that have not hit a stop token

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)

    @property
    def num_active(self) -> int:
        return int(self.active_mask.sum())  # expect: FC101
