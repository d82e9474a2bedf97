"""Chunk KV store: retrieved passages are prefilled once (positions from 0), their pages kept in the
paged KV pool and shared by every request that retrieves the same passage."""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from flashinfer import BatchDecodeWithPagedKVCacheWrapper


@dataclass
class ChunkEntry:
    key: str
    num_tokens: int
    pages: np.ndarray
    refs: int = 0
    layer0_keys: Optional[object] = None  # device tensor [num_tokens, kv_heads, head_dim]


@dataclass
class StoreStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    reused_tokens: int = 0


class ChunkKVStore:
    def __init__(self, page_size: int, capacity_pages: int, layout_source: BatchDecodeWithPagedKVCacheWrapper, free_pages_cb):
        self.page_size = page_size
        self.capacity_pages = capacity_pages
        # chunk pages are written by the same kernels as request pages: keep the layout in sync
        self.kv_layout = layout_source._kv_layout  # expect: FC103
        self._free_pages_cb = free_pages_cb
        self._lru: "OrderedDict[str, ChunkEntry]" = OrderedDict()
        self._used_pages = 0
        self.stats = StoreStats()

    @staticmethod
    def key_of(tokens: list) -> str:
        return hashlib.blake2b(np.asarray(tokens, dtype=np.int32).tobytes(), digest_size=16).hexdigest()

    def lookup(self, tokens: list) -> Optional[ChunkEntry]:
        key = self.key_of(tokens)
        entry = self._lru.get(key)
        if entry is None:
            self.stats.misses += 1
            return None
        self._lru.move_to_end(key)
        entry.refs += 1
        self.stats.hits += 1
        return entry

    def insert(self, tokens: list, pages: np.ndarray, layer0_keys=None) -> ChunkEntry:
        assert len(pages) * self.page_size >= len(tokens), "chunk pages cannot hold the chunk"  # expect: FC109
        while self._used_pages + len(pages) > self.capacity_pages and self._lru:
            self._evict_one()
        entry = ChunkEntry(self.key_of(tokens), len(tokens), np.asarray(pages, dtype=np.int32), 1, layer0_keys)
        self._lru[entry.key] = entry
        self._used_pages += len(pages)
        return entry

    def release(self, entry: ChunkEntry) -> None:
        entry.refs -= 1

    def _evict_one(self) -> None:
        assert self._lru, "evict called on an empty store"  # ok: FC109
        for key, entry in self._lru.items():
            if entry.refs == 0:
                del self._lru[key]
                self._used_pages -= len(entry.pages)
                self.stats.evictions += 1
                self._free_pages_cb(entry.pages)
                return
        raise RuntimeError("every stored chunk is in use")
