"""What the scheduler hands the model runner every step."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import TYPE_CHECKING, List, Optional

import torch

if TYPE_CHECKING:
    from srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE


@dataclass
class ModelWorkerBatch:
    """Host-side view of a scheduled batch (all tensors on the CPU)."""

    forward_mode: ForwardMode
    input_ids_cpu: torch.Tensor
    req_pool_indices_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc_cpu: torch.Tensor
    seq_lens_sum: int
    extend_seq_lens: List[int]
    extend_prefix_lens: List[int]


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    seq_lens_sum: int
    positions: Optional[torch.Tensor] = None
    seq_lens_cpu: Optional[torch.Tensor] = None
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[List[int]] = None
    extend_prefix_lens_cpu: Optional[List[int]] = None
    attn_backend: Optional["HybridLinearAttnBackend"] = None

    @classmethod
    def init_new(cls, batch: ModelWorkerBatch, model_runner) -> "ForwardBatch":
        device = model_runner.device
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens_cpu),
            input_ids=batch.input_ids_cpu.to(device, non_blocking=True),
            req_pool_indices=batch.req_pool_indices_cpu.to(device, non_blocking=True),
            seq_lens=batch.seq_lens_cpu.to(device, non_blocking=True),
            out_cache_loc=batch.out_cache_loc_cpu.to(device, non_blocking=True),
            seq_lens_sum=batch.seq_lens_sum,
            seq_lens_cpu=batch.seq_lens_cpu,
            attn_backend=model_runner.attn_backend,
        )
        if ret.forward_mode.is_extend():
            ret.extend_seq_lens = torch.tensor(batch.extend_seq_lens, dtype=torch.int32).to(device, non_blocking=True)
            ret.extend_prefix_lens = torch.tensor(batch.extend_prefix_lens, dtype=torch.int32).to(device, non_blocking=True)
            ret.extend_seq_lens_cpu = list(batch.extend_seq_lens)
            ret.extend_prefix_lens_cpu = list(batch.extend_prefix_lens)
            ret.positions = torch.cat(
                [torch.arange(p, p + n, device=device) for p, n in zip(batch.extend_prefix_lens, batch.extend_seq_lens)]
            )
        else:
            ret.positions = (ret.seq_lens - 1).to(torch.int64)
        return ret
