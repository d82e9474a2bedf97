"""Per-step batch description handed from the scheduler to the model runner."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence

import numpy as np
import torch


@dataclasses.dataclass
class ScheduledReq:
    rid: str
    pool_idx: int
    seq_len: int
    fill_ids: List[int]
    out_locs: List[int]

    @property
    def last_token(self) -> int:
        return self.fill_ids[-1]


@dataclasses.dataclass
class ForwardBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    extend_lens_cpu: Optional[np.ndarray] = None
    is_decode: bool = True
    use_graph: bool = False
    num_tokens: int = 0

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens_cpu[: self.batch_size].max())  # ok: FC101

    @classmethod
    def from_schedule(
        cls, reqs: Sequence[ScheduledReq], device: torch.device, *, is_decode: bool
    ) -> "ForwardBatch":
        seq_np = np.fromiter((r.seq_len for r in reqs), dtype=np.int32, count=len(reqs))
        seq_lens_cpu = torch.from_numpy(seq_np).pin_memory()
        if is_decode:
            ids = [r.last_token for r in reqs]
            pos = [r.seq_len - 1 for r in reqs]
            locs = [r.out_locs[-1] for r in reqs]
            extend = None
        else:
            ids = [t for r in reqs for t in r.fill_ids]
            pos = [p for r in reqs for p in range(r.seq_len - len(r.fill_ids), r.seq_len)]
            locs = [loc for r in reqs for loc in r.out_locs]
            extend = np.array([len(r.fill_ids) for r in reqs], dtype=np.int32)
        return cls(
            batch_size=len(reqs),
            input_ids=torch.tensor(ids, dtype=torch.int64).pin_memory().to(device, non_blocking=True),
            positions=torch.tensor(pos, dtype=torch.int64).pin_memory().to(device, non_blocking=True),
            seq_lens=seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            req_pool_indices=torch.tensor([r.pool_idx for r in reqs], dtype=torch.int64).to(
                device, non_blocking=True
            ),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64).to(device, non_blocking=True),
            extend_lens_cpu=extend,
            is_decode=is_decode,
            num_tokens=len(ids),
        )
