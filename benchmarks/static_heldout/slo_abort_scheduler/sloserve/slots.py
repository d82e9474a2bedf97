"""Persistent decode rows (one per running request) and their pages, kept on the host with device mirrors."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch

from sloserve.config import EngineConfig


class SlotTable:
    def __init__(self, cfg: EngineConfig, num_pages: int, device: torch.device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.device = device
        n = cfg.max_slots
        self.seq_lens_np = np.zeros(n, dtype=np.int32)
        self.num_pages_np = np.zeros(n, dtype=np.int32)
        self.page_table_np = np.zeros((n, cfg.max_pages_per_slot), dtype=np.int32)
        self.live_np = np.zeros(n, dtype=bool)
        self.num_rows = 0  # rows in use, holes included
        self.slot_of: Dict[int, int] = {}
        self.free_pages: List[int] = list(range(num_pages - 1, 0, -1))  # page 0 is the null page
        # device mirrors read by the append kernel and the prefill plan
        self.last_page_len_gpu = torch.ones(n, dtype=torch.int32, device=device)
        self.page_table_gpu = torch.zeros((n, cfg.max_pages_per_slot), dtype=torch.int32, device=device)

    @property
    def num_holes(self) -> int:
        return self.num_rows - int(self.live_np[: self.num_rows].sum())

    def admit(self, rid: int, prompt_len: int) -> int:
        slot = self.num_rows
        self.num_rows += 1
        self.slot_of[rid] = slot
        self.live_np[slot] = True
        self.seq_lens_np[slot] = 0
        self.num_pages_np[slot] = 0
        self.reserve(slot, prompt_len)
        return slot

    def reserve(self, slot: int, new_len: int) -> None:
        ps = self.page_size
        have = int(self.num_pages_np[slot])
        need = -(-new_len // ps)
        if need > have:
            fresh = [self.free_pages.pop() for _ in range(need - have)]
            self.page_table_np[slot, have:need] = fresh
            self.page_table_gpu[slot, have:need].copy_(torch.tensor(fresh, dtype=torch.int32), non_blocking=True)
            self.num_pages_np[slot] = need
        self.seq_lens_np[slot] = new_len

    def release(self, slot: int) -> None:
        n = int(self.num_pages_np[slot])
        self.free_pages.extend(self.page_table_np[slot, :n].tolist())
        self.num_pages_np[slot] = 0
        self.seq_lens_np[slot] = 0
        self.live_np[slot] = False
        self.slot_of = {r: s for r, s in self.slot_of.items() if s != slot}

    def compact(self) -> List[Tuple[int, int]]:
        """Move live rows down over the holes; returns the (src, dst) moves."""
        moves = []
        dst = 0
        for src in range(self.num_rows):
            if not self.live_np[src]:
                continue
            if src != dst:
                for arr in (self.seq_lens_np, self.num_pages_np, self.live_np):
                    arr[dst] = arr[src]
                self.page_table_np[dst] = self.page_table_np[src]
                self.live_np[src] = False
                moves.append((src, dst))
            dst += 1
        if moves:
            src_t = torch.tensor([m[0] for m in moves], dtype=torch.int64, device=self.device)
            dst_t = torch.tensor([m[1] for m in moves], dtype=torch.int64, device=self.device)
            self.page_table_gpu.index_copy_(0, dst_t, self.page_table_gpu.index_select(0, src_t))
            self.last_page_len_gpu.index_copy_(0, dst_t, self.last_page_len_gpu.index_select(0, src_t))
            moved = dict(moves)
            self.slot_of = {r: moved.get(s, s) for r, s in self.slot_of.items()}
        self.num_rows = dst
        return moves

    def decode_layout(self, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """CSR page layout of decode rows; a hole reads one page of the null page."""
        ps = self.page_size
        counts = np.where(self.live_np[rows], self.num_pages_np[rows], 1).astype(np.int32)
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        parts = [self.page_table_np[r, :c] if self.live_np[r] else np.zeros(1, dtype=np.int32)
                 for r, c in zip(rows.tolist(), counts.tolist())]
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        last = np.where(self.live_np[rows], (np.maximum(self.seq_lens_np[rows], 1) - 1) % ps + 1, 1)
        return indptr, indices.astype(np.int32), last.astype(np.int32)

    def prefix_layout(self, rows: np.ndarray, prefix_lens_np: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        ps = self.page_size
        counts = -(-prefix_lens_np // ps)
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        parts = [self.page_table_np[r, :c] for r, c in zip(rows.tolist(), counts.tolist())]
        indices = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return indptr, indices.astype(np.int32)
