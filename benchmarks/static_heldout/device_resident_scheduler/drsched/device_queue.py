"""The waiting queue as a ring buffer on the GPU.

Rows are ``[request id, prompt length, pages needed, priority]``.  ``ptrs`` holds the monotone
head and tail; both are advanced by device ops only, so admission never waits for the host."""

from __future__ import annotations

from typing import Dict

import torch

REQ_ID, PROMPT_LEN, PAGES_NEEDED, PRIORITY = 0, 1, 2, 3
ROW_WIDTH = 4


class DeviceRequestQueue:
    def __init__(self, capacity: int, device: torch.device):
        assert capacity > 0 and capacity & (capacity - 1) == 0, "capacity must be a power of two"  # expect: FC109
        self.capacity = capacity
        self.mask = capacity - 1
        self.device = device
        self.entries = torch.zeros(capacity, ROW_WIDTH, dtype=torch.int64, device=device)
        self.ptrs = torch.zeros(2, dtype=torch.int64, device=device)
        # what the host has pushed so far; the device decides how much of it was admitted
        self.pushed_host = 0

    @property
    def depth(self) -> torch.Tensor:
        return self.ptrs[1] - self.ptrs[0]

    @property
    def has_waiting(self) -> torch.Tensor:
        return self.depth > 0

    def push(self, rows_cpu: torch.Tensor) -> int:
        n = rows_cpu.shape[0]
        if n == 0:
            return 0
        rows = rows_cpu.to(self.device, non_blocking=True)
        pos = (self.ptrs[1] + torch.arange(n, device=self.device)) & self.mask
        self.entries.index_copy_(0, pos, rows)
        self.ptrs[1].add_(n)
        self.pushed_host += n
        return n

    def peek_window(self, k: int) -> torch.Tensor:
        """The first ``k`` slots after the head (rows past the tail are stale and masked by callers)."""
        pos = (self.ptrs[0] + torch.arange(k, device=self.device)) & self.mask
        return self.entries.index_select(0, pos)

    def window_valid(self, k: int) -> torch.Tensor:
        return torch.arange(k, device=self.device) < self.depth

    def pop(self, n: torch.Tensor) -> None:
        self.ptrs[0].add_(n)


def dump_queue_state(queue: DeviceRequestQueue) -> Dict[str, int]:
    """Operator endpoint: a consistent snapshot of the ring for /debug/queue."""
    head, tail = queue.ptrs.tolist()  # ok: FC101
    return {"head": head, "tail": tail, "depth": tail - head, "capacity": queue.capacity}
