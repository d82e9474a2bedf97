from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_slots: torch.Tensor
    req_slots_np: np.ndarray
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_start_loc_cpu: Optional[torch.Tensor] = None
    # KV write locations of the step's tokens, in the full pool and in the ring
    full_loc: Optional[torch.Tensor] = None
    stream_loc: Optional[torch.Tensor] = None
