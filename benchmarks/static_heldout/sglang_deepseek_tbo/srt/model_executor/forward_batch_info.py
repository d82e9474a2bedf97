"""What the scheduler hands to the model runner for one forward pass (DeepSeek-V3 slice)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from srt.layers.attention import AttentionBackend


class ForwardMode(enum.IntEnum):
    EXTEND = enum.auto()
    DECODE = enum.auto()
    IDLE = enum.auto()
    TARGET_VERIFY = enum.auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.TARGET_VERIFY)


class ScheduleBatchLike(Protocol):
    """The scheduler's view of a batch: numpy arrays, host only."""

    forward_mode: ForwardMode
    input_ids: np.ndarray
    positions: np.ndarray
    req_pool_indices: np.ndarray
    seq_lens: np.ndarray
    out_cache_loc: np.ndarray
    extend_seq_lens: Optional[np.ndarray]
    extend_prefix_lens: Optional[np.ndarray]
    global_num_tokens: Optional[List[int]]


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens_sum: int
    seq_lens_cpu: Optional[torch.Tensor] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    global_num_tokens_cpu: Optional[List[int]] = None
    global_num_tokens_gpu: Optional[torch.Tensor] = None
    tbo_split_seq_index: Optional[int] = None
    tbo_children: Optional[List["ForwardBatch"]] = None
    attn_backend: Optional["AttentionBackend"] = None

    @classmethod
    def init_new(cls, batch: ScheduleBatchLike, model_runner) -> "ForwardBatch":
        device = model_runner.device

        def to_dev(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(a).to(device, non_blocking=True)

        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
            input_ids=to_dev(batch.input_ids),
            positions=to_dev(batch.positions),
            req_pool_indices=to_dev(batch.req_pool_indices),
            seq_lens=to_dev(batch.seq_lens),
            out_cache_loc=to_dev(batch.out_cache_loc),
            seq_lens_sum=int(batch.seq_lens.sum()),
            seq_lens_cpu=torch.from_numpy(batch.seq_lens),
            attn_backend=model_runner.attn_backend,
        )
        if ret.forward_mode.is_extend():
            ret.extend_seq_lens_cpu = batch.extend_seq_lens.tolist()
            ret.extend_prefix_lens_cpu = batch.extend_prefix_lens.tolist()
            ret.extend_seq_lens = torch.from_numpy(batch.extend_seq_lens).to(device, non_blocking=True)
            ret.extend_prefix_lens = torch.from_numpy(batch.extend_prefix_lens).to(device, non_blocking=True)
        if batch.global_num_tokens is not None:
            ret.global_num_tokens_cpu = list(batch.global_num_tokens)
            ret.global_num_tokens_gpu = torch.tensor(batch.global_num_tokens, dtype=torch.int32).to(device, non_blocking=True)
        return ret
