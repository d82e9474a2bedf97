"""The page free-list as a stack on the GPU.

``stack[:top]`` are free page ids; the last slot is a trash slot that masked-out pushes land
in.  The captured decode step pops pages from here when a row's last page fills, so the stack
and ``top`` are read by every replay."""

from __future__ import annotations

import torch

NULL_PAGE = 0


class DevicePageFreeList:
    def __init__(self, num_pages: int, device: torch.device):
        self.device = device
        self.num_pages = num_pages
        # page 0 is the null page padded rows point at; never handed out
        free = torch.arange(1, num_pages, dtype=torch.int32, device=device)
        self.stack = torch.cat([free, free.new_zeros(1)])
        self.top = torch.tensor(num_pages - 1, dtype=torch.int64, device=device)

    @property
    def trash_slot(self) -> int:
        return self.stack.shape[0] - 1

    @property
    def num_free(self) -> int:
        return int(self.top)  # expect: FC101

    def pop_into(self, counts: torch.Tensor, out_pages: torch.Tensor) -> None:
        """Pop ``counts[i]`` (0 or 1) pages for row ``i``; rows that get none receive the null page."""
        order = torch.cumsum(counts, 0) - counts
        src = (self.top - 1 - order).clamp(min=0)
        got = torch.where(counts > 0, self.stack[src], torch.zeros_like(out_pages))
        out_pages.copy_(got)
        self.top.sub_(counts.sum())

    def release(self, pages: torch.Tensor, valid: torch.Tensor) -> None:
        """Push ``pages`` where ``valid``; both stay on the device."""
        order = torch.cumsum(valid.to(torch.int64), 0) - 1
        dst = torch.where(valid, self.top + order, torch.full_like(order, self.trash_slot))
        self.stack.index_copy_(0, dst, pages.to(self.stack.dtype))
        self.top.add_(valid.sum())

    def extend(self, new_pages_cpu: torch.Tensor) -> None:
        """Pages the offloaded prefix cache handed back: the stack grows and they are pushed."""
        n = new_pages_cpu.shape[0]
        self.stack = torch.cat([self.stack, self.stack.new_zeros(n)])  # expect: FC107
        self.num_pages += n
        valid = torch.ones(n, dtype=torch.bool, device=self.device)
        self.release(new_pages_cpu.to(self.device, non_blocking=True), valid)

    def pop_many(self, total: int, out_pages: torch.Tensor) -> None:
        """Pop ``total`` pages (a host count the scheduler computed) into ``out_pages[:total]``."""
        src = (self.top - 1 - torch.arange(total, device=self.device)).clamp(min=0)
        out_pages[:total].copy_(self.stack[src])
        self.top.sub_(total)
