"""Device rows of encoder outputs keyed by multimodal hash; the prefill stage pulls them by row."""

from collections import OrderedDict
from typing import Optional, Tuple

import torch


class EmbeddingCache:
    def __init__(self, rows: int, hidden: int, dtype: torch.dtype, device) -> None:
        self.hidden = hidden
        self.capacity = rows
        self.store = torch.zeros(rows, hidden, dtype=dtype, device=device)
        self._index: "OrderedDict[str, Tuple[int, int]]" = OrderedDict()
        self._used = 0
        self._cursor = 0

    def lookup(self, mm_hash: str) -> Optional[Tuple[int, int]]:
        hit = self._index.get(mm_hash)
        if hit is not None:
            self._index.move_to_end(mm_hash)
        return hit

    def put(self, mm_hash: str, embeds: torch.Tensor) -> Tuple[int, int]:
        assert embeds.shape[-1] == self.hidden, "encoder output width does not match the cache"  # expect: FC109
        n = embeds.shape[0]
        while self._index and (self._used + n > self.capacity or self._cursor + n > self.capacity):
            self._evict()
        start = self._cursor
        self.store[start : start + n].copy_(embeds)
        self._index[mm_hash] = (start, n)
        self._used += n
        self._cursor += n
        return start, n

    def rows(self, start: int, n: int) -> torch.Tensor:
        return self.store[start : start + n]

    def _evict(self) -> None:
        _, (_, n) = self._index.popitem(last=False)
        self._used -= n
        assert self._used >= 0, "embedding cache accounting went negative"  # ok: FC109
        if not self._index:
            self._cursor = 0
