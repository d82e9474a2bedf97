"""Per-step batch objects: the scheduler's host view and the model's device view."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    IDLE = 3

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self == ForwardMode.EXTEND


@dataclass
class ScheduleBatch:
    """What the scheduler hands the model runner each step. Host data only (numpy)."""

    forward_mode: ForwardMode
    rids_np: np.ndarray  # request ids, int64
    req_pool_indices_np: np.ndarray  # int32
    seq_lens_np: np.ndarray  # int32, lengths after this step's tokens
    input_ids_np: np.ndarray  # int64, one per new token
    extend_lens_np: Optional[np.ndarray] = None  # int32, new tokens per request (extend only)
    new_pages_np: Optional[np.ndarray] = None  # int32, pages each request needs this step

    @property
    def batch_size(self) -> int:
        return int(self.rids_np.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids_np.shape[0])


@dataclass
class ForwardBatch:
    """The model's view of one step. Tensors are views of the runner's persistent buffers."""

    forward_mode: ForwardMode
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    use_graph: bool = False
    max_extend_len: int = 0
    logits_indices: Optional[torch.Tensor] = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def for_capture(cls, bs: int, input_buffers, use_graph: bool = True) -> "ForwardBatch":
        ib = input_buffers
        return cls(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            seq_lens=ib.seq_lens[:bs],
            seq_lens_cpu=ib.seq_lens_cpu[:bs],
            req_pool_indices=ib.req_pool_indices[:bs],
            out_cache_loc=ib.out_cache_loc[:bs],
            positions=ib.positions[:bs],
            use_graph=use_graph,
        )


@dataclass
class StepOutput:
    next_token_ids: torch.Tensor  # device
    seq_lens: torch.Tensor  # device, lengths including the sampled token
    next_token_ids_host: torch.Tensor  # pinned, filled by a non_blocking copy
    ready: torch.cuda.Event

    def resolve(self) -> list[int]:
        """Called by the scheduler's output thread, one step behind the GPU."""
        self.ready.synchronize()  # ok: FC101
        return self.next_token_ids_host.tolist()
