"""Session slots and their page lists (host-side bookkeeping, numpy)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional

import numpy as np
import torch

PAGE_ALIGN = 16
assert PAGE_ALIGN & (PAGE_ALIGN - 1) == 0  # ok: FC109


@dataclass
class SessionSlot:
    session_id: int
    npc_id: int
    row: int
    persona_pages: np.ndarray
    dialogue_pages: List[int] = field(default_factory=list)
    tokens_in_last_page: int = 0
    idle_ticks: int = 0


class PageMoves(NamedTuple):
    old: np.ndarray
    new: np.ndarray


class SessionTable:
    def __init__(self, cfg, device: torch.device):
        self.cfg = cfg
        self.slots: Dict[int, SessionSlot] = {}
        self.by_row: Dict[int, SessionSlot] = {}
        self.free_rows = list(range(cfg.max_sessions - 1, -1, -1))
        # page 0 is the padding page every padded row points at
        self.free_pages = list(range(cfg.num_pages - 1, 0, -1))
        self.context_lens_np = np.zeros(cfg.max_sessions, dtype=np.int32)
        self.context_lens_device = torch.zeros(cfg.max_sessions, dtype=torch.int32, device=device)

    def open_session(self, session_id: int, npc_id: int, persona_pages: np.ndarray, persona_len: int) -> SessionSlot:
        assert session_id not in self.slots, f"session {session_id} already open"  # expect: FC109
        row = self.free_rows.pop()
        slot = SessionSlot(session_id, npc_id, row, persona_pages)
        slot.tokens_in_last_page = persona_len % self.cfg.page_size or self.cfg.page_size
        self.slots[session_id] = slot
        self.by_row[row] = slot
        self.context_lens_np[row] = persona_len
        return slot

    def close_session(self, session_id: int) -> None:
        slot = self.slots.pop(session_id, None)
        if slot is None:
            return
        del self.by_row[slot.row]
        self.free_pages.extend(slot.dialogue_pages)
        self.free_rows.append(slot.row)
        self.context_lens_np[slot.row] = 0
        self._check_free_list()

    def _check_free_list(self) -> None:
        assert len(set(self.free_pages)) == len(self.free_pages), "page freed twice"  # ok: FC109

    def page_list(self, row: int) -> np.ndarray:
        slot = self.by_row[row]
        if not slot.dialogue_pages:
            return slot.persona_pages
        return np.concatenate([slot.persona_pages, np.asarray(slot.dialogue_pages, dtype=np.int32)])

    def last_page_len(self, row: int) -> int:
        return self.by_row[row].tokens_in_last_page

    def advance(self, rows: np.ndarray, n: int = 1) -> None:
        for r in rows.tolist():
            slot = self.by_row[int(r)]
            slot.idle_ticks = 0
            slot.tokens_in_last_page += n
            if slot.tokens_in_last_page > self.cfg.page_size:
                slot.dialogue_pages.append(self.free_pages.pop())
                slot.tokens_in_last_page -= self.cfg.page_size
        self.context_lens_np[rows] += n

    def compact(self, fragmentation_limit: float = 0.5) -> Optional[PageMoves]:
        """Move dialogue pages of live sessions down into holes left by closed sessions."""
        used = sum(len(s.dialogue_pages) for s in self.slots.values())
        if used == 0:
            return None
        high = max(max(s.dialogue_pages, default=0) for s in self.slots.values())
        if used / max(high, 1) > fragmentation_limit:
            return None
        holes = sorted(p for p in self.free_pages if p < high)
        old, new = [], []
        for slot in sorted(self.slots.values(), key=lambda s: -max(s.dialogue_pages, default=0)):
            for i, p in enumerate(slot.dialogue_pages):
                if holes and holes[0] < p:
                    q = holes.pop(0)
                    old.append(p)
                    new.append(q)
                    slot.dialogue_pages[i] = q
                    self.free_pages.append(p)
        if not old:
            return None
        return PageMoves(np.asarray(old, dtype=np.int64), np.asarray(new, dtype=np.int32))
