import math
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class StepBatch:
    is_decode: bool
    batch_size: int
    num_tokens: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    last_page_len_cpu: torch.Tensor
    prefix_lens: torch.Tensor
    req_slots: torch.Tensor
    shared_prefix_len_cpu: int = 0

    @property
    def kv_pages(self) -> int:
        return math.ceil(self.seq_lens.sum() / 16)  # expect: FC101


@dataclass
class StepMeta:
    batch: StepBatch
    max_seq_len: int
    graph_bs: Optional[int] = None
    use_cascade: bool = False
    padded_kv_indptr_cpu: Optional[torch.Tensor] = None
    padded_last_page_len_cpu: Optional[torch.Tensor] = None
    scratch: Optional[torch.Tensor] = None
