"""Batch descriptors handed from the scheduler to the model runner and backends."""
from __future__ import annotations

import dataclasses
import enum
from typing import List, Optional

import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self is ForwardMode.EXTEND


@dataclasses.dataclass
class ScheduledBatch:
    """What the scheduler decided for this step, in plain Python."""

    mode: ForwardMode
    rids: List[str]
    input_ids: List[int]
    positions: List[int]
    seq_lens: List[int]
    out_cache_loc: List[int]
    prefix_lens: List[int] = dataclasses.field(default_factory=list)
    extend_lens: List[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    rids: List[str]
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor  # Mamba state slot of every row (device)
    seq_lens: torch.Tensor  # device
    seq_lens_cpu: torch.Tensor  # host
    out_cache_loc: torch.Tensor
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
