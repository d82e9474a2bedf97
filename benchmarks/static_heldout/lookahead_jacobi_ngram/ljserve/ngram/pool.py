"""Host-side n-gram pool fed by the accepted tokens and the Jacobi trajectories (lookahead decoding)."""

from __future__ import annotations

from collections import OrderedDict
from typing import List

import numpy as np


class NGramPool:
    """Maps a key token to the most recent (N-1)-token continuations seen after it, LRU over keys."""

    def __init__(self, ngram_size: int, capacity: int, per_key: int = 16):
        self.ngram_size = ngram_size
        self.capacity = capacity
        self.per_key = per_key
        self._table: "OrderedDict[int, List[np.ndarray]]" = OrderedDict()
        self._hits = 0
        self._lookups = 0

    def __len__(self) -> int:
        return sum(len(v) for v in self._table.values())

    def insert(self, key_token: int, continuation: np.ndarray) -> None:
        key = int(key_token)
        bucket = self._table.setdefault(key, [])
        for existing in bucket:
            if np.array_equal(existing, continuation):
                self._table.move_to_end(key)
                return
        bucket.append(np.array(continuation, dtype=np.int64, copy=True))
        if len(bucket) > self.per_key:
            bucket.pop(0)
        self._table.move_to_end(key)
        while len(self._table) > self.capacity:
            self._table.popitem(last=False)

    def lookup(self, token: int, max_candidates: int) -> np.ndarray:
        """Candidate n-grams starting at ``token``; rows without a candidate repeat the key (never accepted)."""
        assert max_candidates > 0  # expect: FC109
        self._lookups += 1
        out = np.full((max_candidates, self.ngram_size), -1, dtype=np.int64)
        out[:, 0] = token
        found = self._table.get(int(token), [])
        for i, cont in enumerate(reversed(found[-max_candidates:])):
            out[i, 1:] = cont
        n_valid = int(np.count_nonzero(out[:, 1:].any(axis=1) & (out[:, 1] >= 0)))  # ok: FC101
        if n_valid:
            self._hits += 1
        return out

    def hit_rate(self) -> float:
        assert self._hits <= self._lookups  # ok: FC109
        return self._hits / max(1, self._lookups)
