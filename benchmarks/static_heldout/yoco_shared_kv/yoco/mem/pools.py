"""KV memory of a YOCO model.

* ``WindowKVPool``: the self-decoder's K/V. Each request slot owns a ring of ``wide_window / page_size + 1`` pages;
  logical page ``p`` of the request lives in ring entry ``p % ring_size``. Every self-decoder layer has its own
  cache tensor, indexed by the same page ids.
* ``GlobalKVPool``: the single K/V set the self-decoder's output is projected into, shared by every cross-decoder
  layer. It grows with the sequence like an ordinary paged cache.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch


class WindowKVPool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        max_reqs: int,
        wide_window: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device,
    ):
        assert wide_window % page_size == 0, "window must be a whole number of pages"  # expect: FC109
        self.page_size = page_size
        self.ring_size = wide_window // page_size + 1
        self.device = device
        shape = (num_pages, 2, page_size, num_kv_heads, head_dim)
        self.caches = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(num_layers)]
        self.free: List[int] = list(range(num_pages - 1, 0, -1))
        self.ring_pages_np = np.zeros((max_reqs, self.ring_size), dtype=np.int32)
        self.ring_pages = torch.zeros((max_reqs, self.ring_size), dtype=torch.int32, device=device)
        self.ring_len = np.zeros(max_reqs, dtype=np.int64)  # logical pages ever written, per slot
        self._recycled: List[Tuple[int, int, int]] = []

    def layer_cache(self, layer_id: int) -> torch.Tensor:
        return self.caches[layer_id]

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        cache = self.caches[layer_id]
        cache[loc // self.page_size, 0, loc % self.page_size] = k
        cache[loc // self.page_size, 1, loc % self.page_size] = v

    def advance(self, slot: int, new_len: int) -> None:
        """Make room for a request that reached ``new_len`` tokens; recycle pages that left the ring."""
        want = -(-new_len // self.page_size)
        while self.ring_len[slot] < want:
            p = int(self.ring_len[slot])
            entry = p % self.ring_size
            if p >= self.ring_size:
                old = int(self.ring_pages_np[slot, entry])
                self._recycled.append((slot, entry, old))
                page = old  # the page that fell out of the window is reused in place
            else:
                page = self.free.pop()
            self.ring_pages_np[slot, entry] = page
            self.ring_len[slot] += 1
        self.ring_pages[slot].copy_(torch.from_numpy(self.ring_pages_np[slot]), non_blocking=True)

    def take_recycled(self) -> List[Tuple[int, int, int]]:
        out, self._recycled = self._recycled, []
        return out

    def window_lists(
        self, slots_np: np.ndarray, seq_lens_np: np.ndarray, window: int
    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host CSR of the pages that hold the last ``window`` tokens of each row, in logical order."""
        ps = self.page_size
        rows: List[np.ndarray] = []
        for slot, n in zip(slots_np.tolist(), seq_lens_np.tolist()):
            last = (max(n, 1) - 1) // ps
            first = max(0, n - window) // ps
            logical = np.arange(first, last + 1)
            rows.append(self.ring_pages_np[slot, logical % self.ring_size])
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum([len(r) for r in rows], out=indptr[1:])
        indices = np.concatenate(rows).astype(np.int32) if rows else np.zeros(0, dtype=np.int32)
        last_len = ((np.maximum(seq_lens_np, 1) - 1) % ps + 1).astype(np.int32)
        return indptr, indices, last_len


class GlobalKVPool:
    def __init__(self, num_pages: int, max_reqs: int, max_pages_per_req: int, page_size: int,
                 num_kv_heads: int, head_dim: int, device: torch.device):
        self.page_size = page_size
        self.num_pages = num_pages
        self.cache = torch.zeros((num_pages, 2, page_size, num_kv_heads, head_dim), dtype=torch.bfloat16, device=device)
        self.free: List[int] = list(range(num_pages - 1, 0, -1))
        self.used = 0
        self.req_pages: Dict[int, List[int]] = {}

    def num_free(self) -> int:
        assert self.used + len(self.free) == self.num_pages - 1  # ok: FC109
        return len(self.free)

    def grow(self, slot: int, new_len: int) -> None:
        pages = self.req_pages.setdefault(slot, [])
        while len(pages) * self.page_size < new_len:
            pages.append(self.free.pop())
            self.used += 1

    def release(self, slot: int) -> None:
        pages = self.req_pages.pop(slot, [])
        self.free.extend(pages)
        self.used -= len(pages)

    def store(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.cache[loc // self.page_size, 0, loc % self.page_size] = k
        self.cache[loc // self.page_size, 1, loc % self.page_size] = v

    def page_lists(self, slots_np: np.ndarray, seq_lens_np: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        ps = self.page_size
        rows = []
        for slot, n in zip(slots_np.tolist(), seq_lens_np.tolist()):
            if slot < 0:
                rows.append(np.zeros(1, dtype=np.int32))  # padded row: page 0
                continue
            rows.append(np.asarray(self.req_pages[slot][: -(-n // ps)], dtype=np.int32))
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        np.cumsum([len(r) for r in rows], out=indptr[1:])
        indices = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)
        last_len = ((np.maximum(seq_lens_np, 1) - 1) % ps + 1).astype(np.int32)
        return indptr, indices, last_len
