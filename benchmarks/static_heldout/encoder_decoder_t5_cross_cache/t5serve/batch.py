from dataclasses import dataclass
from typing import List

import torch


@dataclass
class DecoderBatch:
    req_ids: List[int]
    req_ids_dev: torch.Tensor          # device, for the slot lookup
    slots_cpu: List[int]
    input_ids: torch.Tensor            # device
    positions: torch.Tensor            # device
    out_loc: torch.Tensor              # device slot of the new token in the self KV
    recent_slots: torch.Tensor         # device [bs, MAX_DISTANCE] slots of the last keys
    self_indptr_cpu: torch.Tensor
    self_indices: torch.Tensor         # device
    self_last_page_len: torch.Tensor   # device
    enc_lens_cpu: torch.Tensor
    cross_indptr_cpu: torch.Tensor

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)
