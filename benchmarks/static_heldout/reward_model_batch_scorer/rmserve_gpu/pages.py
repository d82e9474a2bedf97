"""Paged KV for critique generation: only the scored sequences that ask for a critique keep their KV."""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch

from rmserve.settings import RewardSettings


class CritiquePagePool:
    def __init__(self, settings: RewardSettings, device: torch.device):
        self.settings = settings
        self.page_size = settings.page_size
        shape = (settings.critique_pages, 2, settings.num_kv_heads, settings.page_size, settings.head_dim)
        self.kv = [torch.zeros(shape, dtype=torch.bfloat16, device=device) for _ in range(settings.num_layers)]
        self.free: List[int] = list(range(settings.critique_pages - 1, -1, -1))
        self.pages: Dict[str, List[int]] = {}
        self.lens: Dict[str, int] = {}

    def layer(self, layer_id: int) -> torch.Tensor:
        return self.kv[layer_id]

    def alloc(self, rid: str, num_tokens: int) -> np.ndarray:
        need = -(-num_tokens // self.page_size)
        pages = [self.free.pop() for _ in range(need)]
        self.pages[rid] = pages
        self.lens[rid] = num_tokens
        self._check_pool()
        return np.asarray(pages, dtype=np.int64)

    def extend(self, rid: str, n: int = 1) -> None:
        new_len = self.lens[rid] + n
        while len(self.pages[rid]) * self.page_size < new_len:
            self.pages[rid].append(self.free.pop())
        self.lens[rid] = new_len

    def release(self, rid: str) -> None:
        self.free.extend(self.pages.pop(rid, []))
        self.lens.pop(rid, None)

    def _check_pool(self) -> None:
        used = sum(len(p) for p in self.pages.values())
        assert used + len(self.free) == self.settings.critique_pages  # ok: FC109

    def out_locs(self, rid: str, start: int, n: int) -> np.ndarray:
        pos = np.arange(start, start + n)
        pages = np.asarray(self.pages[rid], dtype=np.int64)
        return pages[pos // self.page_size] * self.page_size + pos % self.page_size

    def table(self, rids: List[str]) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pages per request, flat page ids, last-page lengths) on the host."""
        counts = np.array([len(self.pages[r]) for r in rids], dtype=np.int32)
        flat = np.concatenate([np.asarray(self.pages[r], dtype=np.int32) for r in rids]) if rids else np.zeros(0, np.int32)
        last = np.array([(self.lens[r] - 1) % self.page_size + 1 for r in rids], dtype=np.int32)
        return counts, flat, last

    def store(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_loc: torch.Tensor) -> None:
        kv = self.kv[layer_id]
        page, off = out_loc // self.page_size, out_loc % self.page_size
        kv[page, 0, :, off] = k
        kv[page, 1, :, off] = v
