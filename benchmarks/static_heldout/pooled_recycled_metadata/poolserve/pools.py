"""Free lists of device scratch, leases that hand it back, and a ring of pinned staging slots."""

from __future__ import annotations

import collections
import weakref
from typing import Deque, Dict, List, Tuple

import torch


def _round_up(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()  # ok: FC101


class TensorPool:
    """Power-of-two free lists of device tensors, acquired per step and released after it."""

    def __init__(self, device: torch.device):
        self.device = device
        self._free: Dict[Tuple[int, torch.dtype], List[torch.Tensor]] = collections.defaultdict(list)
        self.outstanding = 0

    def acquire(self, numel, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        n = _round_up(int(numel))  # expect: FC101
        free = self._free[(n, dtype)]
        self.outstanding += 1
        return free.pop() if free else torch.empty(n, dtype=dtype, device=self.device)  # expect: FC105

    def release(self, t: torch.Tensor, scrub: bool = False) -> None:
        assert t.device == self.device, f"tensor from {t.device} released into the {self.device} pool"  # expect: FC109
        if scrub:
            t.zero_()
        self._free[(t.numel(), t.dtype)].append(t)
        self.outstanding -= 1
        assert self.outstanding >= 0, "release without acquire"  # ok: FC109


class Lease:
    __slots__ = ("tensor", "_finalizer", "__weakref__")

    def __init__(self, pool: TensorPool, tensor: torch.Tensor):
        self.tensor = tensor
        self._finalizer = weakref.finalize(self, _give_back, pool, tensor)


def _give_back(pool: TensorPool, tensor: torch.Tensor) -> None:
    # the last kernel that read the tensor may still run: let it finish before anyone else gets it
    torch.cuda.current_stream().synchronize()  # expect: FC101
    pool.release(tensor)


def zeroed_workspace(pool: TensorPool, nbytes: int) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device=pool.device)  # ok: FC105
    ws.zero_()
    return ws


class StagingSlot:
    __slots__ = ("indptr_cpu", "last_page_len_cpu", "indptr_device", "uploaded")

    def __init__(self, max_bs: int, device: torch.device):
        self.indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.indptr_device = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.uploaded = torch.cuda.Event()

    def upload(self, n: int) -> torch.Tensor:
        self.indptr_device[:n].copy_(self.indptr_cpu[:n], non_blocking=True)  # ok: FC101
        self.uploaded.record()
        return self.indptr_device[:n]


class StagingRing:
    def __init__(self, depth: int, max_bs: int, device: torch.device):
        assert depth >= 2, "staging needs at least double buffering"  # expect: FC109
        self.max_bs, self.device = max_bs, device
        self._slots: Deque[StagingSlot] = collections.deque(StagingSlot(max_bs, device) for _ in range(depth))

    def next(self) -> StagingSlot:
        if not self._slots[0].uploaded.query():  # ok: FC101
            self._slots.appendleft(StagingSlot(self.max_bs, self.device))
        self._slots.rotate(-1)
        return self._slots[-1]
