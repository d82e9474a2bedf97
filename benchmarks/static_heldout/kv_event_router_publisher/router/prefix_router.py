"""Prefix-aware router: consumes the workers' KV events and sends a prompt where its prefix is cached."""

from collections import defaultdict
from typing import Dict, List, Set

import torch

from kvevents import BlockHasher, BlockRemoved, BlockStored, KVEventBatch


class PrefixRouter:
    def __init__(self, workers: List[str], block_size: int):
        self.block_size = block_size
        self.hasher = BlockHasher(block_size)
        self.where: Dict[int, Set[str]] = defaultdict(set)
        self.load: Dict[str, int] = {w: 0 for w in workers}

    def on_events(self, worker: str, batch: KVEventBatch) -> None:
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                for h in ev.block_hashes:
                    self.where[h].add(worker)
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    self.where[h].discard(worker)

    def route(self, token_ids: List[int]) -> str:
        n = len(token_ids) // self.block_size * self.block_size
        hashes = self.hasher.hash_blocks(token_ids[:n])
        workers = list(self.load)
        scores = torch.zeros(len(workers))
        for i, w in enumerate(workers):
            for h in hashes:
                if w not in self.where.get(h, ()):
                    break
                scores[i] += 1
        scores -= 0.01 * torch.tensor([self.load[w] for w in workers], dtype=torch.float32)
        ranked = scores.tolist()  # ok: FC101
        best = workers[ranked.index(max(ranked))]
        self.load[best] += 1
        return best
