from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Union

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper


@dataclass
class GroupBatch:
    num_reqs: int
    num_tokens: int
    is_decode: bool
    input_ids: torch.Tensor               # device
    positions: torch.Tensor               # device
    q_lens: torch.Tensor                  # device
    qo_indptr: torch.Tensor               # device
    qo_indptr_cpu: torch.Tensor
    seq_lens: torch.Tensor                # device
    seq_lens_np: np.ndarray
    req_pages: Dict[int, List[np.ndarray]]     # group -> pages of each request (host)
    block_tables: Dict[int, torch.Tensor]      # group -> (num_reqs, max_pages) device table
    no_page_crossed: bool = False


@dataclass
class GroupGraphBuffers:
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor


@dataclass
class GroupStepMetadata:
    """What the local layers of one group need this step."""

    wrapper: Union[BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper]
    slot_mapping: torch.Tensor
    nnz_pages: int


@dataclass
class GlobalStepMetadata:
    """The global layers: head_dim 256, 32-token pages, no window."""

    wrapper: Union[BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper]
    slot_mapping: torch.Tensor


@dataclass
class StepMetadata:
    groups: Dict[int, GroupStepMetadata] = field(default_factory=dict)
    global_meta: Optional[GlobalStepMetadata] = None
    num_reqs: int = 0

