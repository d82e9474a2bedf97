"""What the scheduler hands the runner, and what the runner hands the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class ScheduledBatch:
    rids: List[int]
    is_decode: bool
    input_ids_np: np.ndarray
    seq_lens_np: np.ndarray      # lengths after this step's tokens are appended
    prefix_lens_np: np.ndarray   # cached tokens before this step
    crossed_boundary: bool = False
    prev_intra_nnz: int = 0


@dataclass
class DCAForwardBatch:
    rids: List[int]
    is_decode: bool
    batch_size: int
    input_ids: torch.Tensor
    out_cache_loc: torch.Tensor
    intra_pos: torch.Tensor
    inter_pos: torch.Tensor
    key_pos: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_np: np.ndarray
    prefix_lens_np: np.ndarray
    slots: torch.Tensor
    qo_indptr: Optional[torch.Tensor] = None
    qo_indptr_np: Optional[np.ndarray] = None
    kv_cu_seqlens: Optional[torch.Tensor] = None
    max_q_len: int = 1
    max_kv_len: int = 0
