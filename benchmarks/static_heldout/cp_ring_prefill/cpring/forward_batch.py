from __future__ import annotations

import dataclasses
import enum
from typing import List

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2


@dataclasses.dataclass
class CPForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # this rank's tokens (extend: its two zigzag chunks per request)
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    req_pool_indices_cpu: List[int]
    seq_lens: torch.Tensor  # full (all ranks) lengths, device
    seq_lens_cpu: torch.Tensor
    local_lens: torch.Tensor  # tokens of each request on this rank, device
    local_lens_cpu: List[int]
    out_cache_loc: torch.Tensor  # where this step's KV goes in the local pool
