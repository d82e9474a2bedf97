"""Block pool with hash-addressed prefix caching (host side only)."""
from __future__ import annotations

import hashlib
import struct
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Optional

from rpp.sched.request import Request

_NONE_HASH = 0


def hash_block_tokens(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<q", parent_hash))
    h.update(struct.pack(f"<{len(token_ids)}i", *token_ids))
    return int.from_bytes(h.digest(), "little", signed=True)


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[int] = None

    def reset_hash(self) -> None:
        self.block_hash = None


class BlockPool:
    """Owns every GPU KV block. Freed blocks that hold a full, hashed prefix stay
    cached (and findable by hash) until they are evicted for a new allocation."""

    def __init__(self, num_blocks: int, enable_caching: bool):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # block 0 is the null block: padded rows of captured graphs point at it
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1
        self.free_queue: deque[KVCacheBlock] = deque(self.blocks[1:])
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}
        self.enable_caching = enable_caching
        self.num_hits = 0
        self.num_queries = 0

    def get_num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, block_hash: int) -> Optional[KVCacheBlock]:
        return self.cached_block_hash_to_block.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        assert num_blocks <= self.get_num_free_blocks(), "not enough free blocks"  # expect: FC109
        out = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                self._evict_cached(block)
            block.ref_cnt += 1
            out.append(block)
        return out

    def _evict_cached(self, block: KVCacheBlock) -> None:
        cached = self.cached_block_hash_to_block.pop(block.block_hash, None)
        assert cached is None or cached is block  # ok: FC109
        block.reset_hash()

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0 and block is not self.null_block:
                # a cached block found by a prefix hit leaves the free queue
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        # blocks freed in reverse order: a request's tail is evicted before its prefix
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_cached: int,
                          num_full: int, block_size: int) -> None:
        if not self.enable_caching or num_cached >= num_full:
            return
        token_ids = request.all_token_ids
        parent = request.block_hashes[num_cached - 1] if num_cached > 0 else _NONE_HASH
        for i in range(num_cached, num_full):
            if i < len(request.block_hashes):
                block_hash = request.block_hashes[i]
            else:
                chunk = tuple(token_ids[i * block_size:(i + 1) * block_size])
                block_hash = hash_block_tokens(parent, chunk)
                request.block_hashes.append(block_hash)
            blk = blocks[i]
            if blk.block_hash is None:
                blk.block_hash = block_hash
                self.cached_block_hash_to_block.setdefault(block_hash, blk)
            parent = block_hash

    def hit_rate(self) -> float:
        return self.num_hits / max(1, self.num_queries)
