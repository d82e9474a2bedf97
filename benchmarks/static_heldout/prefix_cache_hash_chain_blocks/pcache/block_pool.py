"""A block pool with ref counts, an LRU evictor of free blocks and a hash -> block map."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from .hashing import BlockHash


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[BlockHash] = None


class BlockPool:
    def __init__(self, num_blocks: int, device: torch.device) -> None:
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # free blocks in eviction order; cached ones stay reusable until popped (block 0 is null)
        self.evictor: "OrderedDict[int, KVBlock]" = OrderedDict((b.block_id, b) for b in self.blocks[1:])
        self.cached: Dict[bytes, KVBlock] = {}
        self.evicted_since_step: List[int] = []
        # hit statistics stay on the device so that the step never waits for them
        self.hit_tokens_dev = torch.zeros((), dtype=torch.int64, device=device)
        self.query_tokens_dev = torch.zeros((), dtype=torch.int64, device=device)

    @property
    def num_free(self) -> int:
        return len(self.evictor)

    def lookup(self, hashes: List[BlockHash]) -> List[KVBlock]:
        hits: List[KVBlock] = []
        for h in hashes:
            if h.value not in self.cached:
                break
            hits.append(self.cached[h.value])
        return hits

    def touch(self, blocks: List[KVBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0:
                self.evictor.pop(block.block_id, None)
            block.ref_cnt += 1

    def allocate(self, n: int) -> List[KVBlock]:
        if n > self.num_free:
            raise RuntimeError(f"need {n} KV blocks, {self.num_free} free")
        out: List[KVBlock] = []
        for _ in range(n):
            _, block = self.evictor.popitem(last=False)
            if block.block_hash is not None:
                self.cached.pop(block.block_hash.value, None)
                self.evicted_since_step.append(block.block_id)
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def cache_full_blocks(self, blocks: List[KVBlock], hashes: List[BlockHash]) -> None:
        for block, h in zip(blocks, hashes):
            if block.block_hash is None:
                block.block_hash = h
                self.cached.setdefault(h.value, block)

    def free(self, blocks: List[KVBlock]) -> None:
        assert all(b.ref_cnt > 0 for b in blocks), "double free of a KV block"  # expect: FC109
        for block in reversed(blocks):  # tail blocks are evicted first
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.evictor[block.block_id] = block
        self._check_invariants()

    def _check_invariants(self) -> None:
        assert self.num_free <= self.num_blocks - 1  # ok: FC109
