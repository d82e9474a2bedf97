from dataclasses import dataclass
from typing import Optional
import torch


@dataclass
class ForwardBatch:
    is_decode: bool
    batch_size: int
    num_tokens: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_lens: torch.Tensor
    extend_lens_cpu: torch.Tensor
    prefix_lens: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    evicted_slots: Optional[torch.Tensor] = None
    qo_indptr: Optional[torch.Tensor] = None
