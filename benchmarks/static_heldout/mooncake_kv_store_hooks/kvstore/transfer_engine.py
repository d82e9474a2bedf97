"""Thin wrapper over the Mooncake transfer engine binding (RDMA or TCP) and its registered memory."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch


class TransferEngine:
    def __init__(self, native: Any, protocol: str = "rdma") -> None:
        self._native = native
        self._backend = protocol
        self._registered: Dict[int, int] = {}

    @property
    def protocol(self) -> str:
        return self._backend

    def register(self, buf: torch.Tensor) -> None:
        """Pin-registered host memory the NIC reads and writes directly."""
        ptr, nbytes = buf.data_ptr(), buf.numel() * buf.element_size()
        if self._native.register_memory(ptr, nbytes) != 0:
            raise RuntimeError(f"register_memory failed for {nbytes} bytes at {ptr:#x}")
        self._registered[ptr] = nbytes

    def batch_exists(self, keys: Sequence[str]) -> torch.Tensor:
        """1 per key the store holds, 0 otherwise (an int32 tensor the binding fills in place)."""
        return self._native.batch_is_exist_tensor(list(keys))

    def batch_read(self, keys: Sequence[str], dst_ptrs: List[int], sizes: List[int]) -> List[int]:
        return self._native.batch_get_into(list(keys), dst_ptrs, sizes)

    def batch_write(self, keys: Sequence[str], src_ptrs: List[int], sizes: List[int]) -> List[int]:
        return self._native.batch_put_from(list(keys), src_ptrs, sizes)
