from __future__ import annotations

from collections import defaultdict
from typing import Optional

from rpp.sched.block_pool import BlockPool, KVCacheBlock, hash_block_tokens
from rpp.sched.request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool, max_model_len: int):
        self.block_size = block_size
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.enable_caching = enable_caching
        self.max_blocks_per_req = (max_model_len + block_size - 1) // block_size
        self.req_to_blocks: defaultdict[str, list[KVCacheBlock]] = defaultdict(list)
        self.num_cached_block: dict[str, int] = {}

    @property
    def usage(self) -> float:
        total = len(self.block_pool.blocks) - 1
        return 1.0 - self.block_pool.get_num_free_blocks() / total

    def _hash_prompt(self, request: Request) -> list[int]:
        if request.block_hashes:
            return request.block_hashes
        parent = 0
        toks = request.all_token_ids
        for i in range(len(toks) // self.block_size):
            parent = hash_block_tokens(parent, tuple(toks[i * self.block_size:(i + 1) * self.block_size]))
            request.block_hashes.append(parent)
        return request.block_hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest cached prefix of full blocks. The last prompt token is always
        recomputed so that the step produces logits for it."""
        if not self.enable_caching:
            return [], 0
        hashes = self._hash_prompt(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for h in hashes[:max_hit_blocks]:
            blk = self.block_pool.get_cached_block(h)
            if blk is None:
                break
            hits.append(blk)
        self.block_pool.num_queries += request.num_tokens
        self.block_pool.num_hits += len(hits) * self.block_size
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: Optional[list[KVCacheBlock]] = None) -> Optional[list[KVCacheBlock]]:
        if num_new_tokens == 0:
            raise ValueError(f"request {request.request_id}: num_new_tokens must be > 0")
        new_computed_blocks = new_computed_blocks or []
        req_blocks = self.req_to_blocks[request.request_id]
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_required = (num_computed + num_new_tokens + self.block_size - 1) // self.block_size
        num_new_blocks = num_required - len(req_blocks) - len(new_computed_blocks)
        # cached blocks that sit in the free queue are taken out of it by touch()
        num_evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.block_pool.get_num_free_blocks() - num_evictable:
            return None
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        req_blocks.extend(new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(max(0, num_new_blocks)) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)
        if self.enable_caching:
            num_full = (num_computed + num_new_tokens) // self.block_size
            num_full = min(num_full, request.num_tokens // self.block_size)
            self.block_pool.cache_full_blocks(request, req_blocks, self.num_cached_block.get(request.request_id, 0),
                                              num_full, self.block_size)
            self.num_cached_block[request.request_id] = num_full
        return new_blocks

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks[request_id]]
