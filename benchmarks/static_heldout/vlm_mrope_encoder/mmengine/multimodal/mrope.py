"""Per-step M-RoPE positions; the decode graphs read `positions` in place."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from ..model_executor.forward_batch import ForwardBatch


class MRopePositionsBuilder:
    def __init__(self, max_tokens: int, device: torch.device) -> None:
        self.device = device
        self.positions = torch.zeros((3, max_tokens), dtype=torch.int64, device=device)
        self.positions_cpu = torch.zeros((3, max_tokens), dtype=torch.int64, pin_memory=True)

    def build(self, fb: "ForwardBatch") -> torch.Tensor:
        decode = fb.forward_mode.is_decode()
        n = fb.batch_size if decode else sum(fb.extend_seq_lens_cpu)  # ok: FC101
        if n > self.positions.shape[1]:
            self.positions = torch.empty((3, n), dtype=torch.int64, device=self.device)  # expect: FC107
            self.positions_cpu = torch.empty((3, n), dtype=torch.int64, pin_memory=True)  # ok: FC107
        host = self.positions_cpu.numpy()
        deltas = np.array([mm.mrope_delta if mm is not None else 0 for mm in fb.mm_inputs], dtype=np.int64)
        if decode:
            # the new token sits at seq_len - 1, shifted by the request's image delta
            host[:, :n] = (fb.seq_lens - 1).cpu().numpy() + deltas  # expect: FC101
        else:
            off = 0
            for mm, prefix, ext, delta in zip(fb.mm_inputs, fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu, deltas):
                if mm is not None and mm.mrope_positions is not None:
                    host[:, off : off + ext] = mm.mrope_positions[:, prefix : prefix + ext]
                else:
                    host[:, off : off + ext] = np.arange(prefix, prefix + ext) + delta
                off += ext
        self.positions[:, :n].copy_(self.positions_cpu[:, :n], non_blocking=True)
        return self.positions[:, :n]
