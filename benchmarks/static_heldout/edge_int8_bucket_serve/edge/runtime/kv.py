"""Static KV pages: every batch slot owns a fixed run of pages for its whole life; page 0 is the scratch page that
padded graph rows read. All bookkeeping is numpy on the host."""
from typing import List, Sequence, Set, Tuple

import numpy as np
import torch

from edge.settings import EdgeSettings


class StaticKVPages:
    def __init__(self, settings: EdgeSettings, device: torch.device, dtype: torch.dtype = torch.float16):
        self._kv_layout = "NHD"
        self.page_size = settings.page_size
        self.pages_per_slot = settings.pages_per_slot
        self.tokens_per_slot = settings.seq_buckets[-1]
        self.max_batch = settings.max_batch
        num_pages = self.max_batch * self.pages_per_slot + 1
        self.caches = [
            torch.zeros(num_pages, 2, settings.page_size, settings.num_kv_heads, settings.head_dim, dtype=dtype, device=device)
            for _ in range(settings.num_layers)
        ]
        self.slot_first_page_np = 1 + np.arange(self.max_batch, dtype=np.int32) * self.pages_per_slot
        self.slot_len_np = np.zeros(self.max_batch, dtype=np.int32)
        self.active_np = np.zeros(self.max_batch, dtype=bool)
        self.slots_in_use: Set[int] = set()

    def acquire(self) -> int:
        for slot in range(self.max_batch):
            if slot not in self.slots_in_use:
                self.slots_in_use.add(slot)
                self.active_np[slot] = True
                self.slot_len_np[slot] = 0
                return slot
        raise RuntimeError("all edge batch slots are busy")

    def release(self, slot: int) -> None:
        self.slots_in_use.discard(slot)
        self.active_np[slot] = False
        self.slot_len_np[slot] = 0

    def assign(self, slot: int, n_tokens: int) -> None:
        assert n_tokens <= self.tokens_per_slot, "sequence longer than the largest graph bucket"  # expect: FC109
        self.slot_len_np[slot] = n_tokens

    def occupancy(self) -> int:
        assert len(self.slots_in_use) <= self.max_batch, "slot set larger than the static batch"  # ok: FC109
        return len(self.slots_in_use)

    def page_table(self, slots: Sequence[int], max_tokens: int, pad_to: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = max(pad_to, len(slots))
        lens = np.minimum(self.slot_len_np[list(slots)], max_tokens)
        pages = (lens + self.page_size - 1) // self.page_size
        indptr = np.zeros(rows + 1, dtype=np.int32)
        indptr[1 : len(slots) + 1] = np.cumsum(pages)
        indptr[len(slots) + 1 :] = indptr[len(slots)] + np.arange(1, rows - len(slots) + 1)
        chunks: List[np.ndarray] = [self.slot_first_page_np[s] + np.arange(p, dtype=np.int32) for s, p in zip(slots, pages)]
        chunks.append(np.zeros(rows - len(slots), dtype=np.int32))
        indices = np.concatenate(chunks)
        last = np.ones(rows, dtype=np.int32)
        last[: len(slots)] = (lens - 1) % self.page_size + 1
        return indptr, indices, last

    def window_table(self, slots: Sequence[int], window: int, pad_to: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        rows = max(pad_to, len(slots))
        lens = self.slot_len_np[list(slots)]
        first = np.maximum(lens - window, 0) // self.page_size
        last_page = (lens - 1) // self.page_size
        pages = last_page - first + 1
        indptr = np.zeros(rows + 1, dtype=np.int32)
        indptr[1 : len(slots) + 1] = np.cumsum(pages)
        indptr[len(slots) + 1 :] = indptr[len(slots)] + np.arange(1, rows - len(slots) + 1)
        chunks = [self.slot_first_page_np[s] + np.arange(f, f + p, dtype=np.int32) for s, f, p in zip(slots, first, pages)]
        chunks.append(np.zeros(rows - len(slots), dtype=np.int32))
        last = np.ones(rows, dtype=np.int32)
        last[: len(slots)] = (lens - 1) % self.page_size + 1
        return indptr, np.concatenate(chunks), last
