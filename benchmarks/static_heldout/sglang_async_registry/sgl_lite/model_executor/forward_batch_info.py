from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class ForwardBatch:
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    q: torch.Tensor
    kv_cache: torch.Tensor
    spec_accept_lens: Optional[torch.Tensor] = None
    use_sliding_window: bool = False
    window_idx: int = 0

    @classmethod
    def init_new(cls, sched_batch, device):
        return cls(
            batch_size=len(sched_batch.reqs),
            seq_lens=sched_batch.seq_lens_cpu.to(device, non_blocking=True),
            seq_lens_cpu=sched_batch.seq_lens_cpu,
            q=sched_batch.q,
            kv_cache=sched_batch.kv_cache,
        )
