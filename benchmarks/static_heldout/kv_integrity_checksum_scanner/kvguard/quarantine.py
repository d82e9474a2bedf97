"""Quarantined pages and page tables rebuilt around them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Set

import numpy as np
import torch


@dataclass
class PageTable:
    indptr: torch.Tensor  # on the device
    indptr_host: torch.Tensor  # pinned
    indices: torch.Tensor  # on the device
    last_page_len_host: torch.Tensor


class QuarantineSet:
    def __init__(self, first_spare: int, num_spares: int) -> None:
        self.pages: Set[int] = set()
        self.remapped: Set[int] = set()
        self.spares: List[int] = list(range(first_spare, first_spare + num_spares))

    def add(self, pages: torch.Tensor) -> None:
        for p in pages.tolist():  # expect: FC101
            self.pages.add(p)

    def add_host(self, pages: List[int]) -> None:
        self.pages.update(pages)

    def take_spare(self) -> int:
        self._check()
        if not self.spares:
            raise RuntimeError("out of spare KV pages; drain the node")
        return self.spares.pop()

    def _check(self) -> None:
        assert not (self.pages & set(self.spares)), "a spare page was quarantined"  # ok: FC109

    def rebuild_page_table(self, page_lists: Sequence[List[int]], kv_lens: np.ndarray, page_size: int,
                           device: torch.device) -> PageTable:
        bs = len(page_lists)
        counts = np.array([len(p) for p in page_lists], dtype=np.int32)
        indptr_host = torch.zeros(bs + 1, dtype=torch.int32, pin_memory=True)
        indptr_host[1:] = torch.from_numpy(np.cumsum(counts))
        flat = np.concatenate([np.asarray(p, dtype=np.int32) for p in page_lists]) if bs else np.zeros(0, np.int32)
        last = torch.from_numpy(((kv_lens - 1) % page_size + 1).astype(np.int32)).pin_memory()
        return PageTable(
            indptr=indptr_host.to(device, non_blocking=True),
            indptr_host=indptr_host,
            indices=torch.from_numpy(flat).to(device, non_blocking=True),
            last_page_len_host=last,
        )
