"""Persona prompts: prefilled once per NPC archetype, pages pinned while a session of that NPC is open."""
from __future__ import annotations

from collections import defaultdict
from typing import Dict

import numpy as np


class PersonaPinner:
    def __init__(self, table):
        self.table = table
        self.pages: Dict[int, np.ndarray] = {}
        self.lengths: Dict[int, int] = {}
        self.open_count: Dict[int, int] = defaultdict(int)

    def has(self, npc_id: int) -> bool:
        return npc_id in self.pages

    def reserve(self, npc_id: int, num_tokens: int) -> np.ndarray:
        n = -(-num_tokens // self.table.cfg.page_size)
        if n > self.table.cfg.persona_pages_max:
            raise ValueError(f"persona of npc {npc_id} needs {n} pages > {self.table.cfg.persona_pages_max}")
        pages = np.asarray([self.table.free_pages.pop() for _ in range(n)], dtype=np.int32)
        self.pages[npc_id] = pages
        self.lengths[npc_id] = num_tokens
        return pages

    def pin(self, npc_id: int) -> np.ndarray:
        self.open_count[npc_id] += 1
        return self.pages[npc_id]

    def unpin(self, npc_id: int) -> None:
        self.open_count[npc_id] -= 1
        if self.open_count[npc_id] == 0:
            # keep the persona around until memory pressure evicts it
            pass

    def evict_unpinned(self) -> int:
        freed = 0
        for npc_id in [k for k, c in self.open_count.items() if c == 0]:
            self.table.free_pages.extend(self.pages.pop(npc_id).tolist())
            del self.open_count[npc_id]
            self.lengths.pop(npc_id, None)
            freed += 1
        return freed
