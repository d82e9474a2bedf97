"""Paged KV pool and the workspaces the attention kernels keep between steps."""

from __future__ import annotations

import functools
from typing import List

import numpy as np
import torch

from .config import JFConfig


@functools.lru_cache(maxsize=4)
def get_context_workspace(nbytes: int, device: str) -> torch.Tensor:
    """trtllm-gen context kernels on Blackwell; one buffer per (size, device)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


class PagedKVPool:
    def __init__(self, cfg: JFConfig, device: torch.device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        dt = getattr(torch, cfg.dtype)
        # HND: [pages, 2, kv_heads, page_size, head_dim]
        self.layers = [
            torch.zeros(cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=dt, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.block_table_np = np.zeros((cfg.max_batch_size, cfg.max_pages_per_request), dtype=np.int32)
        self.block_table = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_request, dtype=torch.int32, device=device)
        self._free: List[int] = list(range(cfg.num_pages - 1, 0, -1))
        self._n_pages = np.zeros(cfg.max_batch_size, dtype=np.int32)

    def ensure(self, slot: int, seq_len: int) -> bool:
        need = -(-seq_len // self.page_size)
        have = int(self._n_pages[slot])
        if need - have > len(self._free):
            return False
        for i in range(have, need):
            self.block_table_np[slot, i] = self._free.pop()
        if need > have:
            self.block_table[slot, have:need].copy_(torch.from_numpy(self.block_table_np[slot, have:need]), non_blocking=True)
            self._n_pages[slot] = need
        return True

    def truncate(self, slot: int, seq_len: int) -> None:
        """Retokenization dropped tokens: give back pages past the new length."""
        keep = -(-seq_len // self.page_size)
        have = int(self._n_pages[slot])
        self._free.extend(int(p) for p in self.block_table_np[slot, keep:have][::-1])
        self._n_pages[slot] = keep

    def release(self, slot: int) -> None:
        self.truncate(slot, 0)

    def pages(self, slot: int) -> np.ndarray:
        return self.block_table_np[slot, : self._n_pages[slot]]
