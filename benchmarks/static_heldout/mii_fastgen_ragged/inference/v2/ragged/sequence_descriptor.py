"""Host-side sequence bookkeeping and the blocked KV allocator (FastGen style)."""

from typing import Iterable, List

import numpy as np


class DSSequenceDescriptor:
    """What the engine knows about one live sequence; kept entirely on the host."""

    __slots__ = ("uid", "seen_tokens", "in_flight_tokens", "_blocks", "max_blocks")

    def __init__(self, uid: int, max_blocks: int) -> None:
        self.uid, self.max_blocks = uid, max_blocks
        self.seen_tokens = self.in_flight_tokens = 0
        self._blocks: List[int] = []

    @property
    def kv_blocks(self) -> List[int]:
        return self._blocks

    @kv_blocks.setter
    def kv_blocks(self, blocks: List[int]) -> None:
        if len(blocks) > self.max_blocks:
            raise ValueError(f"sequence {self.uid}: {len(blocks)} blocks > max_blocks={self.max_blocks}")
        self._blocks = list(blocks)

    def post_forward(self) -> None:
        self.seen_tokens += self.in_flight_tokens
        self.in_flight_tokens = 0


class BlockedAllocator:
    def __init__(self, num_blocks: int) -> None:
        assert num_blocks > 0, "allocator needs at least one block"  # expect: FC109
        self._num_blocks = self._top = num_blocks
        self._free = np.arange(num_blocks, dtype=np.int32)[::-1].copy()

    def allocate(self, num_blocks: int) -> np.ndarray:
        if num_blocks > self._top:
            raise RuntimeError(f"out of KV blocks: want {num_blocks}, {self._top} free")
        start = self._top - num_blocks
        out = self._free[start : self._top][::-1].copy()
        self._top = start
        return out

    def free(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            self._free[self._top] = b
            self._top += 1
        self._check_invariants()

    def _check_invariants(self) -> None:
        assert self._top <= self._num_blocks, "double free in BlockedAllocator"  # ok: FC109
