from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class EventBatch:
    is_prefill: bool
    batch_size: int
    req_ids: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    page_table_np: np.ndarray
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    kv_last_page_len_cpu: torch.Tensor
    block_tables: torch.Tensor
    kv_cu_seqlens: torch.Tensor
    slot_mapping_cpu: torch.Tensor
    max_q_len: int
    max_kv_len: int
    out_cache_loc: Optional[torch.Tensor] = None
