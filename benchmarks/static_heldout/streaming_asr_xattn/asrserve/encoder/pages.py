"""Encoder outputs as KV pages: the decoder's cross-attention reads them, and a stream's pages grow by one
encoder frame every 40 ms chunk (a new page every ``enc_page_size`` chunks)."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch


class EncoderPageTable:
    def __init__(self, settings, device: torch.device, cross_last_page_len: torch.Tensor):
        S = settings.max_streams
        self.device = device
        self.page_size = settings.enc_page_size
        self.max_pages_per_stream = settings.max_enc_pages_per_stream()
        self.num_pages = S * self.max_pages_per_stream
        self.page_table_np = np.zeros((S, self.max_pages_per_stream), dtype=np.int32)
        self.pages_np = np.zeros(S, dtype=np.int32)
        self.enc_lens_np = np.zeros(S, dtype=np.int32)
        # device copies read by the decoder's metadata and the position bias
        self.enc_lens = torch.zeros(S, dtype=torch.int32, device=device)
        self.prev_enc_lens = torch.zeros(S, dtype=torch.int32, device=device)
        self.page_counts = torch.zeros(S, dtype=torch.int32, device=device)
        self.page_indptr = torch.zeros(S + 1, dtype=torch.int32, device=device)
        self.last_page_len_out = cross_last_page_len
        self._free: List[int] = list(range(self.num_pages - 1, -1, -1))
        self._plan_info: Dict[Tuple[int, int], int] = {}  # ok: FC103

    def chunk_plan_id(self, n_streams: int, n_frames: int) -> int:
        return self._plan_info.setdefault((n_streams, n_frames), len(self._plan_info))

    def append_chunk(self, row: int, num_frames: int) -> np.ndarray:
        """Reserve room for ``num_frames`` new encoder frames of stream ``row``; returns their slot ids."""
        assert num_frames > 0  # expect: FC109
        old = int(self.enc_lens_np[row])
        new = old + num_frames
        need = -(-new // self.page_size)
        while self.pages_np[row] < need:
            self.page_table_np[row, self.pages_np[row]] = self._free.pop()
            self.pages_np[row] += 1
        self.enc_lens_np[row] = new
        pos = np.arange(old, new)
        slots = self.page_table_np[row, pos // self.page_size].astype(np.int64) * self.page_size + pos % self.page_size
        # keep the cross-attention graphs' last-page length current without waiting for the next plan
        self.last_page_len_out[row] = (new - 1) % self.page_size + 1  # expect: FC104
        return slots

    def publish(self, rows: np.ndarray) -> None:
        idx = torch.from_numpy(rows).to(self.device, non_blocking=True)
        self.enc_lens[idx] = torch.from_numpy(self.enc_lens_np[rows]).to(self.device, non_blocking=True)
        self.page_counts[idx] = torch.from_numpy(self.pages_np[rows]).to(self.device, non_blocking=True)

    def gather(self, rows: np.ndarray, width: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        pages = self.pages_np[rows]
        indptr = np.zeros(width + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1 : len(rows) + 1])
        indptr[len(rows) + 1 :] = indptr[len(rows)]
        indices = np.concatenate([self.page_table_np[r, :p] for r, p in zip(rows, pages)])
        last = np.ones(width, dtype=np.int32)
        last[: len(rows)] = (self.enc_lens_np[rows] - 1) % self.page_size + 1
        self.page_indptr[: width + 1].copy_(torch.from_numpy(indptr), non_blocking=True)
        return indptr, indices, last

    def release(self, row: int) -> None:
        n = int(self.pages_np[row])
        self._free.extend(self.page_table_np[row, :n].tolist())
        self.pages_np[row] = 0
        self.enc_lens_np[row] = 0

    def free_pages(self) -> int:
        assert len(self._free) <= self.num_pages  # ok: FC109
        return len(self._free)
