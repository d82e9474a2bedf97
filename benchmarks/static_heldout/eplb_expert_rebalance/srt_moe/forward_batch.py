"""The batch the model runner hands to the attention backend and the model."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import List, Optional

import numpy as np
import torch


class ForwardMode(IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # host
    out_cache_loc: torch.Tensor
    req_pages: List[np.ndarray]  # host page ids per request
    block_table: torch.Tensor  # device, for trtllm-gen
    max_seq_len: int = 0
    use_trtllm: bool = False
    extend_seq_lens: Optional[torch.Tensor] = None  # device
    extend_seq_lens_cpu: Optional[List[int]] = None
    graph_bs: Optional[int] = None
