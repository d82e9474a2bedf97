from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    IDLE = 3


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    # restart generation in which each row's pages were (re)loaded
    restore_gen: torch.Tensor
    extend_qo_indptr: Optional[torch.Tensor] = None
