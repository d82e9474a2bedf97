"""Block allocation, prefix reuse and eviction; every change becomes a KV event."""

import logging
from typing import Dict, List, Tuple

import numpy as np
import torch
from flashcheck import hot_path

from kvevents import BlockHasher, BlockRemoved, BlockStored

logger = logging.getLogger(__name__)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, device: torch.device, hasher: BlockHasher):
        self.block_size = block_size
        self.hasher = hasher
        self.ref_counts_np = np.zeros(num_blocks, dtype=np.int32)
        # decremented on device by the finish kernel, a step ahead of the host mirror
        self.ref_counts_dev = torch.zeros(num_blocks, dtype=torch.int32, device=device)
        self.cached_dev = torch.zeros(num_blocks, dtype=torch.bool, device=device)
        self.free: List[int] = list(range(num_blocks - 1, -1, -1))
        self.block_of_hash: Dict[int, int] = {}
        self.hash_of_block: Dict[int, int] = {}
        self.req_blocks: Dict[int, List[int]] = {}
        self.req_hashes: Dict[int, List[int]] = {}
        self.low_watermark = num_blocks // 64
        self.sweep_on_device = True
        self._kv_layout = "NHD"

    def layout(self) -> str:
        return self._kv_layout  # ok: FC103

    def allocate(self, req_id: int, n: int) -> List[int]:
        got = [self.free.pop() for _ in range(n)]
        self.ref_counts_np[got] += 1
        self.req_blocks.setdefault(req_id, []).extend(got)
        return got

    @hot_path
    def commit_step(
        self, req_ids: List[int], token_lists: List[List[int]], next_ids: List[int]
    ) -> Tuple[List[BlockStored], List[BlockRemoved], List[Tuple[int, int]]]:
        stored: List[BlockStored] = []
        for rid, toks, nxt in zip(req_ids, token_lists, next_ids):
            toks.append(nxt)
            hashes = self.req_hashes.setdefault(rid, [])
            done = len(hashes) * self.block_size
            full = len(toks) // self.block_size * self.block_size
            if full <= done:
                continue
            parent = hashes[-1] if hashes else None
            new = self.hasher.hash_blocks(toks[done:full], parent)
            blocks = self.req_blocks[rid][len(hashes) : len(hashes) + len(new)]
            for h, b in zip(new, blocks):
                self.block_of_hash[h] = b
                self.hash_of_block[b] = h
            hashes.extend(new)
            stored.append(BlockStored(block_hashes=new, parent_block_hash=parent, token_ids=toks[done:full], block_size=self.block_size))
        removed, remaps = self._evict(stored)
        return stored, removed, remaps

    def _evict(self, stored: List[BlockStored]) -> Tuple[List[BlockRemoved], List[Tuple[int, int]]]:
        if len(self.free) >= self.low_watermark:
            return [], []
        idle_np = np.flatnonzero(self.ref_counts_np == 0)  # ok: FC101
        victims = [int(b) for b in idle_np if int(b) in self.hash_of_block]
        if self.sweep_on_device:
            idle_dev = torch.nonzero((self.ref_counts_dev == 0) & self.cached_dev).flatten()  # expect: FC101
            logger.debug("device sweep found idle blocks %s", idle_dev)  # ok: FC101
        gone: List[int] = []
        for b in victims[: self.low_watermark]:
            gone.extend(self.hasher.forget(self.hash_of_block.pop(b)))
            self.free.append(b)
        for h in gone:
            self.block_of_hash.pop(h, None)
        remaps = self._compact(victims[: self.low_watermark])
        return ([BlockRemoved(block_hashes=gone)] if gone else []), remaps

    def _compact(self, freed: List[int]) -> List[Tuple[int, int]]:
        """Moves the highest live cached blocks into freed low slots; returns (old, new) pairs."""
        moves: List[Tuple[int, int]] = []
        live = sorted(self.hash_of_block, reverse=True)
        for dst, src in zip(sorted(freed), live):
            if src <= dst:
                break
            h = self.hash_of_block.pop(src)
            self.hash_of_block[dst] = h
            self.block_of_hash[h] = dst
            moves.append((src, dst))
        return moves
