"""Pinned host mirrors of the per-step lengths and page table, with the device twins graphs read."""

import torch


class MirrorBank:
    def __init__(self, capacity: int, max_pages: int, max_bs: int, device):
        self.capacity = capacity
        self.device = device
        self.seq_lens_pinned = torch.zeros(capacity, dtype=torch.int32, pin_memory=True)
        self.seq_lens_np = self.seq_lens_pinned.numpy()
        self.seq_lens_dev = torch.zeros(capacity, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indices_cpu = torch.zeros(max_pages, dtype=torch.int32, pin_memory=True)
        self._pushed = 0

    def stage_lengths(self, lens: list) -> int:
        n = len(lens)
        self.seq_lens_np[:n] = lens
        self.seq_lens_np[n:] = 0
        return n

    def push(self, bs: int):
        assert self.seq_lens_pinned.is_pinned()  # ok: FC109
        self.seq_lens_dev[:bs].copy_(self.seq_lens_pinned[:bs], non_blocking=True)
        self._pushed = bs

    @property
    def pushed(self) -> int:
        return self._pushed
