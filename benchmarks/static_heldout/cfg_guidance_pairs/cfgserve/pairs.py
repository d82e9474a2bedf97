"""Host bookkeeping of (conditional, unconditional) row pairs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from cfgserve.config import GenConfig


@dataclass
class RowPair:
    req_id: str
    slot: int
    cond_len: int
    uncond_len: int
    generated: int = 0
    guidance: float = 5.0
    temperature: float = 1.0


class PairTable:
    """Slot i holds the pair's conditional row as row i and its unconditional row as
    row max_pairs + i of the page table."""

    def __init__(self, cfg: GenConfig):
        self.cfg = cfg
        self.max_pairs = cfg.max_pairs
        rows = 2 * cfg.max_pairs
        self.page_table_np = np.zeros((rows, cfg.max_pages_per_row), dtype=np.int32)
        self.seq_len_np = np.zeros(rows, dtype=np.int32)
        self.generated_np = np.zeros(cfg.max_pairs, dtype=np.int32)
        self.free_slots = list(range(cfg.max_pairs - 1, -1, -1))
        self.free_pages = list(range(cfg.num_pages - 1, 0, -1))  # page 0 is the null page
        self.pairs: dict[str, RowPair] = {}

    def add(self, req_id: str, prompt_len: int, uncond_len: int, guidance: float,
            temperature: float) -> Optional[RowPair]:
        assert prompt_len > 0 and uncond_len > 0, (prompt_len, uncond_len)  # expect: FC109
        if not self.free_slots:
            return None
        need = self._pages_for(prompt_len + self.cfg.image_tokens) + self._pages_for(uncond_len + self.cfg.image_tokens)
        if need > len(self.free_pages):
            return None
        slot = self.free_slots.pop()
        for row, n in ((slot, prompt_len), (self.max_pairs + slot, uncond_len)):
            k = self._pages_for(n + self.cfg.image_tokens)
            self.page_table_np[row, :k] = [self.free_pages.pop() for _ in range(k)]
            self.seq_len_np[row] = n
        pair = RowPair(req_id, slot, prompt_len, uncond_len, guidance=guidance, temperature=temperature)
        self.pairs[req_id] = pair
        self.generated_np[slot] = 0
        return pair

    def _pages_for(self, n: int) -> int:
        return (n + self.cfg.page_size - 1) // self.cfg.page_size

    def release(self, req_id: str) -> RowPair:
        pair = self.pairs.pop(req_id)
        for row in (pair.slot, self.max_pairs + pair.slot):
            k = self._pages_for(int(self.seq_len_np[row]))
            self.free_pages.extend(self.page_table_np[row, :k].tolist())
            self.page_table_np[row] = 0
            self.seq_len_np[row] = 0
        self.free_slots.append(pair.slot)
        self._check_rows()
        return pair

    def _check_rows(self) -> None:
        assert len(self.free_slots) + len(self.pairs) == self.max_pairs  # ok: FC109

    def rows_of(self, slots: np.ndarray) -> np.ndarray:
        """Cond rows then uncond rows of the given slots."""
        return np.concatenate([slots, slots + self.max_pairs])
