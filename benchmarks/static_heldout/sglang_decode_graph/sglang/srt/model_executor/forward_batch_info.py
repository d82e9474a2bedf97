from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Optional

import torch


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    def is_decode_or_idle(self):
        return self == ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: Optional[torch.Tensor]
    seq_lens_sum: int
    out_cache_loc: torch.Tensor
    extend_seq_lens: Optional[torch.Tensor] = None
    extend_seq_lens_cpu: Optional[list] = None
    extend_prefix_lens: Optional[torch.Tensor] = None
    extend_prefix_lens_cpu: Optional[list] = None

    @classmethod
    def init_new(cls, batch, model_runner):
        device = model_runner.device
        seq_lens_cpu = torch.tensor(batch.seq_lens, dtype=torch.int32)
        ret = cls(
            forward_mode=batch.forward_mode,
            batch_size=len(batch.seq_lens),
            req_pool_indices=torch.tensor(batch.req_pool_indices, dtype=torch.int64).to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            seq_lens_sum=sum(batch.seq_lens),  # ok: FC101
            out_cache_loc=batch.out_cache_loc,
        )
        if not ret.forward_mode.is_decode_or_idle():
            ret.extend_seq_lens = torch.tensor(batch.extend_lens, dtype=torch.int32, device=device)
            ret.extend_seq_lens_cpu = list(batch.extend_lens)
            ret.extend_prefix_lens = torch.tensor(batch.prefix_lens, dtype=torch.int32, device=device)
            ret.extend_prefix_lens_cpu = list(batch.prefix_lens)
        return ret
