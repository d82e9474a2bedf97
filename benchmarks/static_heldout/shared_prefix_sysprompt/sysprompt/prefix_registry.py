"""Registered system prompts: their KV pages, reference counts and relocation."""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from sysprompt.config import PAGE_SIZE, ServerConfig

# called with (old page ids, new page ids) after ``compact`` moved pages
RelocateFn = Callable[[np.ndarray, np.ndarray], None]


def prompt_key(system_prompt: str, model_tag: str) -> str:
    return hashlib.sha1(f"{model_tag}\x00{system_prompt}".encode()).hexdigest()


@dataclass
class PrefixEntry:
    key: str
    pages: np.ndarray
    num_tokens: int
    slot: int
    refcount: int = 0
    last_used: float = field(default_factory=time.monotonic)

    @property
    def last_page_len(self) -> int:
        return (self.num_tokens - 1) % PAGE_SIZE + 1


class PrefixRegistry:
    """Maps prompt keys to prefix entries; pages live in the shared prefix region."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.entries: Dict[str, PrefixEntry] = {}
        self.by_slot: Dict[int, PrefixEntry] = {}
        self.free_pages: List[int] = list(range(cfg.max_prefix_pages))
        self.free_slots: List[int] = list(range(cfg.max_running))
        self._relocate_cbs: List[RelocateFn] = []

    def on_relocate(self, cb: RelocateFn) -> None:
        self._relocate_cbs.append(cb)

    def lookup(self, key: str) -> Optional[PrefixEntry]:
        return self.entries.get(key)

    def acquire(self, key: str, num_tokens: int) -> Tuple[PrefixEntry, bool]:
        """Take a reference on ``key``; returns (entry, needs_prefill)."""
        assert num_tokens > 0, "empty system prompt"  # expect: FC109
        entry = self.entries.get(key)
        if entry is not None:
            entry.refcount += 1
            entry.last_used = time.monotonic()
            return entry, False
        need = (num_tokens + PAGE_SIZE - 1) // PAGE_SIZE
        while len(self.free_pages) < need and self._evict_one():
            pass
        if len(self.free_pages) < need or not self.free_slots:
            raise MemoryError(f"prefix region full: need {need} pages, {len(self.free_pages)} free")
        pages = np.array([self.free_pages.pop() for _ in range(need)], dtype=np.int32)
        entry = PrefixEntry(key=key, pages=pages, num_tokens=num_tokens, slot=self.free_slots.pop(), refcount=1)
        self.entries[key] = entry
        self.by_slot[entry.slot] = entry
        return entry, True

    def release(self, key: str) -> None:
        entry = self.entries[key]
        entry.refcount -= 1
        entry.last_used = time.monotonic()

    def _evict_one(self) -> bool:
        idle = [e for e in self.entries.values() if e.refcount == 0]
        if not idle:
            return False
        victim = min(idle, key=lambda e: e.last_used)
        assert victim.refcount == 0  # ok: FC109
        del self.entries[victim.key]
        del self.by_slot[victim.slot]
        self.free_pages.extend(victim.pages.tolist())
        self.free_slots.append(victim.slot)
        return True

    def compact(self) -> None:
        """Move live prefixes to the low pages so that long prompts find contiguous room."""
        order = sorted(self.entries.values(), key=lambda e: e.slot)
        flat_old = np.concatenate([e.pages for e in order]) if order else np.zeros(0, np.int32)
        flat_new = np.arange(flat_old.shape[0], dtype=np.int32)
        moved = np.flatnonzero(flat_old != flat_new)
        if moved.size == 0:
            return
        offset = 0
        for e in order:
            e.pages = flat_new[offset : offset + e.pages.shape[0]].copy()
            offset += e.pages.shape[0]
        self.free_pages = list(range(offset, self.cfg.max_prefix_pages))
        for cb in self._relocate_cbs:
            cb(flat_old[moved].astype(np.int64), flat_new[moved].astype(np.int64))

    def page_table(self, slots: Sequence[int]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host CSR page table of the given prefix slots, one row per group."""
        entries = [self.by_slot[s] for s in slots]
        indptr = np.zeros(len(entries) + 1, dtype=np.int32)
        indptr[1:] = np.cumsum([e.pages.shape[0] for e in entries])
        indices = np.concatenate([e.pages for e in entries]) if entries else np.zeros(0, np.int32)
        last = np.array([e.last_page_len for e in entries], dtype=np.int32)
        return indptr, indices, last
