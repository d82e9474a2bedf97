"""What the scheduler hands the runner (host lists) and the per-step batch the model sees."""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch

from tabserve.modes import ForwardMode, SamplingFlag


@dataclasses.dataclass
class ScheduleOutput:
    """One scheduler decision, host data only."""

    forward_mode: ForwardMode
    req_pool_indices: List[int]
    seq_lens: List[int]
    input_ids: List[int]
    positions: List[int]
    out_cache_loc: List[int]
    extend_seq_lens: Optional[List[int]] = None
    extend_prefix_lens: Optional[List[int]] = None
    custom_mask: Optional[List[bool]] = None
    temperatures: List[float] = dataclasses.field(default_factory=list)
    top_p: List[float] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SamplingInfo:
    temperatures: torch.Tensor
    top_p: torch.Tensor
    flags: SamplingFlag
    all_greedy: bool


@dataclasses.dataclass
class ForwardBatch:
    """Device tensors for the kernels beside the host copies the planners read."""

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: Optional[torch.Tensor]
    out_cache_loc: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    custom_mask: Optional[torch.Tensor] = None
    sampling: Optional[SamplingInfo] = None
    use_graph: bool = False
    padded_batch_size: int = 0
    # Set by the extend planners: token offsets of each request (device), for the last-token gather.
    qo_offsets: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        if self.padded_batch_size == 0:
            self.padded_batch_size = self.batch_size

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
