"""What the scheduler hands the backends each step: device tensors beside pinned `*_stage` mirrors."""
from dataclasses import dataclass
from typing import List

import torch


@dataclass
class ForwardInput:
    input_ids: torch.Tensor        # device
    positions: torch.Tensor        # device
    seq_lens: torch.Tensor         # device
    kv_indices: torch.Tensor       # device, flattened page ids
    block_table: torch.Tensor      # device, [bs, max_pages_in_batch]
    out_cache_loc: torch.Tensor    # device, one slot per row
    seq_lens_stage: torch.Tensor   # pinned host mirror of seq_lens
    kv_indptr_stage: torch.Tensor  # pinned host, [bs + 1]
    qo_indptr_stage: torch.Tensor  # pinned host, arange(bs + 1)
    last_page_len_stage: torch.Tensor

    @property
    def batch_size(self) -> int:
        return self.seq_lens_stage.shape[0]

    @property
    def num_pages(self) -> int:
        return int(self.kv_indptr_stage[-1])


@dataclass
class PrefillInput:
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_slots: torch.Tensor        # device, one per request
    extend_lens: torch.Tensor      # device, new tokens per request
    qo_indptr: torch.Tensor        # device, cumulative extend lengths
    extend_lens_list: List[int]
    num_tokens: int
