"""What the scheduler hands the worker (host arrays) and what the model runner builds from it."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2


@dataclass
class SchedBatch:
    req_ids: np.ndarray
    req_slots_np: np.ndarray
    input_ids_np: np.ndarray
    seq_lens_np: np.ndarray
    extend_lens_np: Optional[np.ndarray] = None  # None for a decode batch


@dataclass
class ForwardBatch:
    mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    extend_lens_cpu: Optional[torch.Tensor] = None
    qo_indptr: Optional[torch.Tensor] = None
    graph_bs: Optional[int] = None

    @property
    def is_decode(self) -> bool:
        return self.mode == ForwardMode.DECODE

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens_cpu.max())  # ok: FC101

    @property
    def total_kv_tokens(self) -> int:
        return int(self.seq_lens.sum())  # expect: FC101
