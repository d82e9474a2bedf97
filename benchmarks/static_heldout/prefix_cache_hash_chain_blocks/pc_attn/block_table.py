"""Per-slot block ids: filled on the host by the scheduler, committed to the device per step."""
from __future__ import annotations

from typing import List

import numpy as np
import torch


class BlockTable:
    def __init__(self, max_num_seqs: int, max_blocks: int, device: torch.device) -> None:
        self.device, self.max_num_seqs = device, max_num_seqs
        self.block_ids = torch.zeros(max_num_seqs, max_blocks, dtype=torch.int32, device=device)
        self.num_blocks = torch.zeros(max_num_seqs, dtype=torch.int32, device=device)
        self.block_ids_cpu = torch.zeros(max_num_seqs, max_blocks, dtype=torch.int32, pin_memory=True)
        self.num_blocks_cpu = torch.zeros(max_num_seqs, dtype=torch.int32, pin_memory=True)
        self.block_ids_np = self.block_ids_cpu.numpy()
        self.num_blocks_np = self.num_blocks_cpu.numpy()

    @property
    def widest_row(self) -> torch.Tensor:
        return self.num_blocks.max()

    def set_row(self, slot: int, block_ids: List[int]) -> None:
        n = len(block_ids)
        if n > self.block_ids_np.shape[1]:
            self._widen_host(n)
        self.block_ids_np[slot, :n] = block_ids
        self.num_blocks_np[slot] = n

    def _widen_host(self, width: int) -> None:
        wider = torch.zeros(self.max_num_seqs, width, dtype=torch.int32, pin_memory=True)
        wider[:, : self.block_ids_cpu.shape[1]].copy_(self.block_ids_cpu)
        self.block_ids_cpu = wider  # ok: FC107
        self.block_ids_np = self.block_ids_cpu.numpy()

    def commit(self, slots: List[int]) -> None:
        extra = self.block_ids_np.shape[1] - self.block_ids.shape[1]
        if extra > 0:
            pad = torch.zeros(self.max_num_seqs, extra, dtype=torch.int32, device=self.device)
            self.block_ids = torch.cat([self.block_ids, pad], dim=1)  # expect: FC107
        idx_cpu = torch.as_tensor(np.asarray(slots, dtype=np.int64))
        idx = idx_cpu.to(self.device, non_blocking=True)
        rows = self.block_ids_cpu.index_select(0, idx_cpu).pin_memory()
        counts = self.num_blocks_cpu.index_select(0, idx_cpu).pin_memory()
        self.block_ids.index_copy_(0, idx, rows.to(self.device, non_blocking=True))
        self.num_blocks.index_copy_(0, idx, counts.to(self.device, non_blocking=True))
