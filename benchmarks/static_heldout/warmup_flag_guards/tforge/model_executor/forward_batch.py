from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

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
class SamplingInfo:
    temperatures: torch.Tensor
    top_ps: torch.Tensor
    # speculative decoding: the draft tokens to verify, [bs, num_draft]
    draft_token_ids: Optional[torch.Tensor] = None
    draft_probs: Optional[torch.Tensor] = None


@dataclass
class ScheduleBatch:
    """What the scheduler hands over: host lists only."""

    forward_mode: ForwardMode
    req_pool_indices: list[int]
    seq_lens: list[int]
    input_ids: list[int]
    out_cache_loc: list[int]
    prefix_lens: list[int] = field(default_factory=list)
    extend_lens: list[int] = field(default_factory=list)
    temperatures: list[float] = field(default_factory=list)
    top_ps: list[float] = field(default_factory=list)


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    out_cache_loc: torch.Tensor
    extend_start_loc_cpu: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[torch.Tensor] = None
    sampling_info: Optional[SamplingInfo] = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @classmethod
    def init_new(cls, batch: ScheduleBatch, device: torch.device) -> "ForwardBatch":
        seq_lens_cpu = torch.tensor(batch.seq_lens, dtype=torch.int32)
        if batch.forward_mode.is_decode():
            positions_cpu = seq_lens_cpu.to(torch.int64) - 1
            extend_start = None
            prefix_cpu = None
        else:
            ext = torch.tensor(batch.extend_lens, dtype=torch.int32)
            prefix_cpu = torch.tensor(batch.prefix_lens, dtype=torch.int32)
            extend_start = torch.zeros(len(batch.extend_lens) + 1, dtype=torch.int32)
            torch.cumsum(ext, 0, out=extend_start[1:])
            positions_cpu = torch.cat([torch.arange(p, p + e) for p, e in zip(batch.prefix_lens, batch.extend_lens)])
        info = SamplingInfo(
            temperatures=torch.tensor(batch.temperatures, dtype=torch.float32).to(device, non_blocking=True),
            top_ps=torch.tensor(batch.top_ps, dtype=torch.float32).to(device, non_blocking=True),
        )
        return cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
            input_ids=torch.tensor(batch.input_ids, dtype=torch.int64).to(device, non_blocking=True),
            positions=positions_cpu.to(device, non_blocking=True),
            req_pool_indices=torch.tensor(batch.req_pool_indices, dtype=torch.int64).to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            out_cache_loc=torch.tensor(batch.out_cache_loc, dtype=torch.int64).to(device, non_blocking=True),
            extend_start_loc_cpu=extend_start,
            extend_prefix_lens_cpu=prefix_cpu,
            sampling_info=info,
        )
