from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor          # window pool slots of the new tokens
    global_cache_loc: torch.Tensor       # global pool slots of the new tokens
    req_slots: torch.Tensor
    req_slots_np: np.ndarray
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[torch.Tensor] = None
    extend_start_loc_cpu: Optional[torch.Tensor] = None
