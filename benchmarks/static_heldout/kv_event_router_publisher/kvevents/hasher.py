"""Chained block hashes: a block's hash covers its parent's hash and its tokens (a radix path)."""

import hashlib
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np

NONE_HASH = int.from_bytes(hashlib.sha256(b"kv-root").digest()[:8], "little")


class BlockHasher:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.nodes: Dict[int, Tuple[Optional[int], int]] = {}  # hash -> (parent, depth)
        self.children: Dict[int, Set[int]] = defaultdict(set)

    def hash_block(self, parent: Optional[int], tokens: Sequence[int]) -> int:
        h = hashlib.sha256()
        h.update((NONE_HASH if parent is None else parent).to_bytes(8, "little"))
        h.update(np.asarray(tokens, dtype=np.int64).tobytes())
        return int.from_bytes(h.digest()[:8], "little")

    def hash_blocks(self, token_ids: Sequence[int], parent_hash: Optional[int] = None) -> List[int]:
        assert len(token_ids) % self.block_size == 0, "only full blocks are hashed"  # expect: FC109
        out: List[int] = []
        parent = parent_hash
        for s in range(0, len(token_ids), self.block_size):
            h = self.hash_block(parent, token_ids[s : s + self.block_size])
            depth = 0 if parent is None else self.nodes.get(parent, (None, -1))[1] + 1
            self.nodes.setdefault(h, (parent, depth))
            if parent is not None:
                self.children[parent].add(h)
            out.append(h)
            parent = h
        return out

    def forget(self, h: int) -> List[int]:
        """Drops a block and its descendants; returns every hash removed."""
        removed, stack = [], [h]
        while stack:
            cur = stack.pop()
            if cur not in self.nodes:
                continue
            parent, _ = self.nodes.pop(cur)
            removed.append(cur)
            stack.extend(self.children.pop(cur, ()))
            if parent is not None:
                self.children[parent].discard(cur)
        return removed
