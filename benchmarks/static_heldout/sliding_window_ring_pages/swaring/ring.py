"""Per-request rings of KV pages for sliding-window layers.

A request never holds more than ``ring_pages`` pages for its window layers: when the
window moves past the oldest page, that page is reused for the newest tokens.  The
logical order of the ring (oldest first) rotates every ``page_size`` tokens.
"""

import logging
from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from swaring.config import SWAConfig

logger = logging.getLogger(__name__)


@dataclass
class RingState:
    row: int
    seq_len: int
    head: int            # ring slot holding the oldest page still in the window
    window_offset: int   # tokens of the oldest page already outside the window


class RingPageTable:
    def __init__(self, cfg: SWAConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        R = cfg.ring_pages
        self.free_pages: List[int] = list(range(cfg.num_pages - 1, 0, -1))
        self.rows: Dict[str, RingState] = {}
        self.ring_np = np.zeros((cfg.max_batch_size, R), dtype=np.int32)
        self.ring_len_np = np.zeros(cfg.max_batch_size, dtype=np.int32)
        self.ring_dev = torch.zeros(cfg.max_batch_size, R, dtype=torch.int32, device=device)
        self.head_dev = torch.zeros(cfg.max_batch_size, dtype=torch.int64, device=device)
        self.seq_lens_dev = torch.zeros(cfg.max_batch_size, dtype=torch.int32, device=device)
        self.recycled_total = 0

    def admit(self, req_id: str, row: int, prompt_len: int) -> RingState:
        assert prompt_len > 0 and row < self.cfg.max_batch_size, "bad admission"  # expect: FC109
        R, page = self.cfg.ring_pages, self.cfg.page_size
        n = min(R, (prompt_len + page - 1) // page)
        for i in range(n):
            self.ring_np[row, i] = self.free_pages.pop()
        self.ring_len_np[row] = n
        head, off = self._window_start(prompt_len)
        st = RingState(row=row, seq_len=prompt_len, head=head, window_offset=off)
        self.rows[req_id] = st
        self._ring_invariant()
        return st

    def _window_start(self, seq_len: int):
        page, R = self.cfg.page_size, self.cfg.ring_pages
        first_tok = max(0, seq_len - self.cfg.window)
        return (first_tok // page) % R, first_tok % page

    def _ring_invariant(self) -> None:
        assert (self.ring_len_np <= self.cfg.ring_pages).all()  # ok: FC109

    def advance(self, rows: torch.Tensor, new_token_pos: torch.Tensor) -> int:
        """Called once per decode step with the device rows and positions of the new tokens."""
        page, R = self.cfg.page_size, self.cfg.ring_pages
        slot = (new_token_pos // page) % R
        crossed = (new_token_pos % page) == 0
        head_pages = self.ring_dev[rows, slot]
        # pages whose slot comes round again are recycled in place: the new page is the old one
        recycled = head_pages[crossed]  # expect: FC101
        self.recycled_total += recycled.numel()
        self.head_dev[rows] = torch.where(crossed, (slot + 1) % R, self.head_dev[rows])  # ok: FC101
        self.seq_lens_dev[rows] = (new_token_pos + 1).to(torch.int32)
        for st in self.rows.values():
            st.seq_len += 1
            st.head, st.window_offset = self._window_start(st.seq_len)
            if int(self.ring_len_np[st.row]) < R and (st.seq_len - 1) % page == 0:  # ok: FC101
                self.ring_np[st.row, self.ring_len_np[st.row]] = self.free_pages.pop()
                self.ring_len_np[st.row] += 1
        return int(self.recycled_total)

    def logical_pages(self, st: RingState) -> np.ndarray:
        n = int(self.ring_len_np[st.row])
        ring = self.ring_np[st.row, :n]
        if n < self.cfg.ring_pages:
            return ring
        return np.roll(ring, -st.head)

    def release(self, req_id: str) -> None:
        st = self.rows.pop(req_id)
        n = int(self.ring_len_np[st.row])
        self.free_pages.extend(self.ring_np[st.row, :n].tolist())
        self.ring_len_np[st.row] = 0

    def dump_ring_state(self) -> Dict[str, List[int]]:
        heads = self.head_dev.cpu()  # ok: FC101
        return {rid: [int(heads[st.row])] + self.logical_pages(st).tolist() for rid, st in self.rows.items()}
