"""One block pool shared by every KV-cache group (scheduler side, host only)."""
from __future__ import annotations

from collections import deque
from typing import Optional

from ..kv_cache_interface import KVCacheConfig, SlidingWindowSpec, cdiv

NULL_BLOCK = 0


class HybridKVCacheCoordinator:
    def __init__(self, config: KVCacheConfig) -> None:
        self.ref_cnt = [0] * config.num_blocks
        self.free_queue: deque[int] = deque(range(1, config.num_blocks))
        self.specs = [g.kv_cache_spec for g in config.kv_cache_groups]
        self.req_to_blocks: list[dict[str, list[int]]] = [{} for _ in self.specs]

    def allocate_slots(self, request_id: str, num_computed: int, num_new: int) -> Optional[list[list[int]]]:
        tables = [t.setdefault(request_id, []) for t in self.req_to_blocks]
        needed = [max(0, cdiv(num_computed + num_new, s.block_size) - len(b)) for s, b in zip(self.specs, tables)]
        if sum(needed) > len(self.free_queue):
            return None
        new_ids = []
        for gid, spec in enumerate(self.specs):
            blocks = tables[gid]
            if isinstance(spec, SlidingWindowSpec):
                # blocks that fell out of the window go back to the shared pool
                cut = min(len(blocks), max(0, num_computed - spec.sliding_window + 1) // spec.block_size)
                self._release(blocks[:cut])
                blocks[:cut] = [NULL_BLOCK] * cut
            new_ids.append([self._pop_free() for _ in range(needed[gid])])
            blocks.extend(new_ids[-1])
        return new_ids

    def _pop_free(self) -> int:
        block = self.free_queue.popleft()
        assert self.ref_cnt[block] == 0, f"block {block} on the free queue is still referenced"  # ok: FC109
        self.ref_cnt[block] = 1
        return block

    def _release(self, blocks: list[int]) -> None:
        for block in blocks:
            if block != NULL_BLOCK:
                self.ref_cnt[block] -= 1
                if self.ref_cnt[block] == 0:
                    self.free_queue.append(block)
