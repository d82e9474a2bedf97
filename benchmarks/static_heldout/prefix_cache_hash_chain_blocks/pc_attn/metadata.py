"""What the scheduler hands the builder, and what the builder hands the backend."""

from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch


@dataclass
class StepBatch:
    num_reqs: int
    num_decodes: int
    slots: List[int]
    input_ids: torch.Tensor
    positions: torch.Tensor
    query_lens_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    prefix_lens_np: np.ndarray
    prefix_lens: torch.Tensor
    shared_prefix_blocks: int = 0
    new_rows: Dict[int, List[int]] = field(default_factory=dict)


@dataclass
class PrefixStepMeta:
    num_reqs: int
    num_decodes: int
    num_prefill_tokens: int
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len_cpu: torch.Tensor
    last_page_len: torch.Tensor
    seq_lens_cpu: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    max_seq_len: int
    shared_prefix_blocks: int = 0
