"""Level one: an n-gram index over every token the server has seen (host only)."""

from collections import Counter
from typing import Dict, Sequence, Tuple

import numpy as np


class NgramIndex:
    def __init__(self, n: int, max_proposals: int, max_entries: int = 1 << 20) -> None:
        assert 1 <= n <= 8, "n-gram order out of range"  # expect: FC109
        self.n = n
        self.max_proposals = max_proposals
        self.max_entries = max_entries
        self._table: Dict[Tuple[int, ...], Counter] = {}

    def observe(self, tokens: Sequence[int]) -> None:
        n = self.n
        for i in range(len(tokens) - n):
            key = tuple(tokens[i : i + n])
            if key not in self._table and len(self._table) >= self.max_entries:
                continue
            self._table.setdefault(key, Counter())[tokens[i + n]] += 1

    def propose(self, history: np.ndarray, k: int) -> np.ndarray:
        """A greedy chain of up to k tokens continuing ``history``; padded with -1."""
        out = np.full(k, -1, dtype=np.int64)
        ctx = [int(t) for t in history[-self.n :].tolist()]
        for i in range(min(k, self.max_proposals)):
            nxt = self._table.get(tuple(ctx[-self.n :]))
            if not nxt:
                break
            tok = nxt.most_common(1)[0][0]
            out[i] = tok
            ctx.append(tok)
        return out
