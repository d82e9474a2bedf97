"""Host-side block tables of one instance, with blocks reserved for incoming migrations."""
from __future__ import annotations

from collections import deque

import numpy as np


class BlockTable:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = deque(range(1, num_blocks))  # block 0 is the padding block of captured batches
        self.used_mask = np.zeros(num_blocks, dtype=np.bool_)
        self.tables: dict[int, list] = {}
        self.reserved: dict[int, list] = {}

    def _take(self, n: int) -> list:
        if n > len(self.free):
            raise MemoryError(f"need {n} blocks, {len(self.free)} free")
        out = [self.free.popleft() for _ in range(n)]
        self.used_mask[out] = True
        return out

    def allocate(self, rid: int, num_tokens: int) -> list:
        blocks = self._take(-(-num_tokens // self.block_size))
        self.tables[rid] = blocks
        return blocks

    def append_slot(self, rid: int, seq_len: int) -> int:
        table = self.tables[rid]
        if seq_len > len(table) * self.block_size:
            table.extend(self._take(1))
        pos = seq_len - 1
        return table[pos // self.block_size] * self.block_size + pos % self.block_size

    def free_request(self, rid: int) -> None:
        blocks = self.tables.pop(rid, [])
        self.used_mask[blocks] = False
        self.free.extend(blocks)

    def reserve(self, mig_id: int, num_blocks: int) -> list:
        blocks = self._take(num_blocks)
        self.reserved[mig_id] = blocks
        return blocks

    def commit_reserved(self, mig_id: int, rid: int) -> None:
        self.tables[rid] = self.reserved.pop(mig_id)

    def abort_reserved(self, mig_id: int) -> None:
        blocks = self.reserved.pop(mig_id, [])
        self.used_mask[blocks] = False
        self.free.extend(blocks)
