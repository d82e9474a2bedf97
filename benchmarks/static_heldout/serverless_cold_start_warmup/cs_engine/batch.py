from dataclasses import dataclass

import torch


@dataclass
class StepBatch:
    bs: int
    tokens: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
