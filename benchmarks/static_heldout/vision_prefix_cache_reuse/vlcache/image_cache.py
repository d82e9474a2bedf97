"""Encoder outputs and prefix KV pages of images, keyed by content hash, evicted least recently used."""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from vlcache.hashing import _check_hash
from vlcache.pool import PagePool

logger = logging.getLogger(__name__)


@dataclass
class CachedImage:
    image_hash: str
    slot: int
    page_ids: List[int]
    pages_dev: torch.Tensor
    num_tokens: int  # tile-padded to whole pages
    page_size: int
    token_mask: torch.Tensor  # which of the padded tokens carry image content
    embeds: Optional[torch.Tensor] = None
    pins: int = 0
    last_used_step: int = 0

    @property
    def num_pages(self) -> int:
        return len(self.page_ids)  # ok: FC101

    @property
    def valid_tokens(self) -> int:
        return int(self.token_mask.sum())  # expect: FC101

    @property
    def last_page_len(self) -> int:
        return (self.num_tokens - 1) % self.page_size + 1


class ImageKVCache:
    def __init__(self, pool: PagePool, page_size: int, max_entries: int, device: torch.device):
        self.pool = pool
        self.page_size = page_size
        self.device = device
        self._entries: "OrderedDict[str, CachedImage]" = OrderedDict()
        self._free_slots = list(range(max_entries - 1, -1, -1))
        # read counts per entry, bumped on the device by every prefill that reuses the prefix
        self.hits_dev = torch.zeros(max_entries, dtype=torch.int32, device=device)
        self.step = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, image_hash: str) -> Optional[CachedImage]:
        key = _check_hash(image_hash)
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            entry.last_used_step = self.step
        return entry

    def insert(self, image_hash: str, pages: List[int], num_tokens: int, token_mask: torch.Tensor,
               embeds: Optional[torch.Tensor] = None) -> CachedImage:
        assert num_tokens <= len(pages) * self.page_size  # expect: FC109
        if not self._free_slots:
            raise MemoryError("image cache has no free entry slot; evict before inserting")
        entry = CachedImage(
            image_hash=image_hash,
            slot=self._free_slots.pop(),
            page_ids=list(pages),
            pages_dev=torch.tensor(pages, dtype=torch.int32, device=self.device),
            num_tokens=num_tokens,
            page_size=self.page_size,
            token_mask=token_mask,
            embeds=embeds,
            last_used_step=self.step,
        )
        self.hits_dev[entry.slot] = 0
        self._entries[image_hash] = entry
        return entry

    def record_hits(self, entries: List[CachedImage]) -> None:
        if entries:
            slots = torch.tensor([e.slot for e in entries], dtype=torch.int64).to(self.device, non_blocking=True)
            self.hits_dev.index_add_(0, slots, torch.ones_like(slots, dtype=torch.int32))

    def pin(self, entry: CachedImage) -> None:
        entry.pins += 1
        self.pool.incref(entry.page_ids)

    def unpin(self, entry: CachedImage) -> None:
        entry.pins -= 1
        self.pool.decref(entry.page_ids)

    def evict_lru(self, need_pages: int) -> List[CachedImage]:
        """Drop unpinned entries until ``need_pages`` pages are free: oldest first, coldest among equals."""
        evicted: List[CachedImage] = []
        while self.pool.num_free < need_pages:
            cands = [e for e in self._entries.values() if e.pins == 0]
            if not cands:
                break
            oldest = min(e.last_used_step for e in cands)
            cands = [e for e in cands if e.last_used_step == oldest]
            idx = torch.tensor([e.slot for e in cands], dtype=torch.int64, device=self.device)
            victim = cands[self.hits_dev[idx].argmin().item()]  # ok: FC101
            del self._entries[victim.image_hash]
            self._free_slots.append(victim.slot)
            self.pool.decref(victim.page_ids)
            evicted.append(victim)
        if evicted:
            logger.info("evicted %d images (%d pages free)", len(evicted), self.pool.num_free)
        return evicted

    def remap(self, mapping: np.ndarray) -> None:
        for e in self._entries.values():
            e.page_ids = [int(mapping[p]) for p in e.page_ids]
            e.pages_dev = torch.tensor(e.page_ids, dtype=torch.int32, device=self.device)
