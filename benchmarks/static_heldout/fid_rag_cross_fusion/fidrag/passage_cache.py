"""Encoded passages kept in cross-attention pages, reused across queries by document hash."""

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Sequence

import numpy as np

from fidrag.config import FiDConfig


def doc_hash(token_ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(np.asarray(token_ids, dtype=np.int32).tobytes(), digest_size=16).digest()


def hash_words(key: bytes) -> List[int]:
    """The 128-bit key as two signed int64 words (what the device-side key table stores)."""
    hi = int.from_bytes(key[:8], "little", signed=True)
    lo = int.from_bytes(key[8:], "little", signed=True)
    return [hi, lo]


@dataclass
class CachedPassage:
    key: bytes
    pages: np.ndarray
    num_tokens: int
    last_use: int = 0


class PassageCache:
    def __init__(self, cfg: FiDConfig, num_pages: int):
        self.cfg = cfg
        self.num_pages = num_pages
        self.entries: "OrderedDict[bytes, CachedPassage]" = OrderedDict()
        self.free_np = np.arange(num_pages, dtype=np.int32)[::-1].copy()
        self.n_free = num_pages
        self._backend = "device"
        self._used = 0
        self.clock = 0

    def lookup(self, keys: List[bytes]) -> np.ndarray:
        self.clock += 1
        hits = np.zeros(len(keys), dtype=bool)
        for i, k in enumerate(keys):
            e = self.entries.get(k)
            if e is not None:
                e.last_use = self.clock
                self.entries.move_to_end(k)
                hits[i] = True
        return hits

    def get(self, key: bytes) -> CachedPassage:
        return self.entries[key]

    def alloc(self, n: int) -> np.ndarray:
        while self.n_free < n:
            self.evict_one()
        pages = self.free_np[self.n_free - n : self.n_free].copy()
        self.n_free -= n
        self._used += n
        return pages

    def insert(self, key: bytes, pages: np.ndarray, num_tokens: int) -> None:
        assert len(pages) > 0, "a cached passage needs at least one page"  # expect: FC109
        self.entries[key] = CachedPassage(key, pages, num_tokens, self.clock)
        self._check_free()

    def evict_one(self) -> CachedPassage:
        _, victim = self.entries.popitem(last=False)
        n = victim.pages.size
        self.free_np[self.n_free : self.n_free + n] = victim.pages
        self.n_free += n
        self._used -= n
        return victim

    def _check_free(self) -> None:
        assert self.n_free + self._used == self.num_pages  # ok: FC109
