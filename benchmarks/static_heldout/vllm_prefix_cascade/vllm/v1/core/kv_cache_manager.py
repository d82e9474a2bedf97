"""Scheduler-side KV cache manager with automatic prefix caching.  Host-only bookkeeping."""

from __future__ import annotations

import hashlib
import pickle
from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

NONE_HASH = 0


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


class BlockHash(NamedTuple):
    hash_value: int
    token_ids: Tuple[int, ...]


def hash_block_tokens(parent: Optional[BlockHash], token_ids: Sequence[int], extra_keys: Optional[tuple] = None) -> BlockHash:
    parent_value = NONE_HASH if parent is None else parent.hash_value
    digest = hashlib.sha256(pickle.dumps((parent_value, tuple(token_ids), extra_keys))).digest()
    return BlockHash(int.from_bytes(digest[:8], "little"), tuple(token_ids))


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: Optional[BlockHash] = None


class BlockPool:
    def __init__(self, num_blocks: int):
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue: "OrderedDict[int, KVCacheBlock]" = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: Dict[BlockHash, KVCacheBlock] = {}

    def get_cached_block(self, block_hash: BlockHash) -> Optional[KVCacheBlock]:
        return self.cached.get(block_hash)

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        for blk in blocks:
            if blk.ref_cnt == 0:
                self.free_queue.pop(blk.block_id, None)
            blk.ref_cnt += 1

    def get_new_blocks(self, num_blocks: int) -> List[KVCacheBlock]:
        if num_blocks > len(self.free_queue):
            raise ValueError(f"need {num_blocks} free blocks, have {len(self.free_queue)}")
        out = []
        for _ in range(num_blocks):
            _, blk = self.free_queue.popitem(last=False)
            assert blk.ref_cnt == 0, "free queue holds a referenced block"  # ok: FC109
            if blk.block_hash is not None:
                self.cached.pop(blk.block_hash, None)
                blk.block_hash = None
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def release(self, blocks: Sequence[KVCacheBlock]) -> None:
        for blk in reversed(blocks):
            blk.ref_cnt -= 1
            if blk.ref_cnt == 0:
                self.free_queue[blk.block_id] = blk

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], hashes: Sequence[BlockHash], start: int, end: int) -> None:
        for blk, block_hash in zip(blocks[start:end], hashes[start:end]):
            blk.block_hash = block_hash
            self.cached[block_hash] = blk


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks)
        self.req_to_blocks: Dict[str, List[KVCacheBlock]] = defaultdict(list)
        self.req_to_block_hashes: Dict[str, List[BlockHash]] = defaultdict(list)
        self.num_cached_block: Dict[str, int] = {}

    def _block_hashes(self, request) -> List[BlockHash]:
        hashes = self.req_to_block_hashes[request.request_id]
        tokens = request.all_token_ids
        parent = hashes[-1] if hashes else None
        for start in range(len(hashes) * self.block_size, len(tokens) - self.block_size + 1, self.block_size):
            parent = hash_block_tokens(parent, tokens[start : start + self.block_size], request.mm_hashes)
            hashes.append(parent)
        return hashes

    def get_computed_blocks(self, request) -> Tuple[List[KVCacheBlock], int]:
        computed: List[KVCacheBlock] = []
        for block_hash in self._block_hashes(request):
            blk = self.block_pool.get_cached_block(block_hash)
            if blk is None:
                break
            computed.append(blk)
        if computed and len(computed) * self.block_size == request.num_tokens:
            computed.pop()  # the last token is recomputed to produce logits
        return computed, len(computed) * self.block_size

    def allocate_slots(self, request, num_new_tokens: int, new_computed_blocks: Sequence[KVCacheBlock] = ()) -> Optional[List[KVCacheBlock]]:
        assert num_new_tokens > 0, "allocate_slots needs at least one new token"  # expect: FC109
        req_blocks = self.req_to_blocks[request.request_id]
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_required = cdiv(num_computed + num_new_tokens, self.block_size)
        num_new = num_required - len(req_blocks) - len(new_computed_blocks)
        if num_new > len(self.block_pool.free_queue):
            return None
        self.block_pool.touch(new_computed_blocks)
        req_blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(num_new, 0))
        req_blocks.extend(new_blocks)
        num_full = (num_computed + num_new_tokens) // self.block_size
        start = self.num_cached_block.get(request.request_id, 0)
        self.block_pool.cache_full_blocks(req_blocks, self._block_hashes(request), start, num_full)
        self.num_cached_block[request.request_id] = num_full
        return new_blocks

    def get_num_common_prefix_blocks(self, request, num_running_requests: int) -> int:
        """Blocks every running request references: the shared prefix cascade attention can split off."""
        n = 0
        for blk in self.req_to_blocks[request.request_id]:
            if blk.ref_cnt != num_running_requests:
                break
            n += 1
        return n

    def free(self, request) -> None:
        self.block_pool.release(self.req_to_blocks.pop(request.request_id, []))
        self.num_cached_block.pop(request.request_id, None)
