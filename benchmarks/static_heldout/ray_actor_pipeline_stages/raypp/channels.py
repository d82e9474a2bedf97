from multiprocessing import shared_memory
from typing import Optional

import numpy as np
import torch

from raypp.config import HEADER_BYTES


class ShmChannel:
    """One-directional activation channel between two stage actors on a host:
    a shared-memory segment with a sequence number, a pinned staging buffer
    on the sending side."""

    def __init__(self, name: str, nbytes: int, dtype: torch.dtype, create: bool = False):
        assert nbytes > HEADER_BYTES and (nbytes - HEADER_BYTES) % 4096 == 0, "payload must be whole pages"  # expect: FC109
        self.shm = shared_memory.SharedMemory(name=name, create=create, size=nbytes)
        self.dtype = dtype
        self.capacity = (nbytes - HEADER_BYTES) // torch.empty(0, dtype=dtype).element_size()
        self.header = np.ndarray((2,), dtype=np.int64, buffer=self.shm.buf[:16])
        self.staging: Optional[torch.Tensor] = None
        self._seen = 0

    def _payload(self, n: int) -> torch.Tensor:
        return torch.frombuffer(self.shm.buf, dtype=self.dtype, count=n, offset=HEADER_BYTES)

    def send(self, t: torch.Tensor) -> None:
        n = t.numel()
        if self.staging is None:
            self.staging = torch.empty(self.capacity, dtype=self.dtype, pin_memory=True)  # ok: FC107
        self.staging[:n].copy_(t.reshape(-1))  # expect: FC101
        self._payload(n).copy_(self.staging[:n])
        self.header[0] = n
        self.header[1] += 1

    def recv_into(self, dst: torch.Tensor) -> None:
        while int(self.header[1]) == self._seen:
            pass
        self._seen = int(self.header[1])
        n = dst.numel()
        dst.copy_(self._payload(n).view(dst.shape), non_blocking=True)  # ok: FC101

    def close(self, unlink: bool = False) -> None:
        self.shm.close()
        if unlink:
            self.shm.unlink()
