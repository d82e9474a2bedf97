"""Paged KV cache (HND) with a host free list; batches index it by page id."""

from __future__ import annotations

from typing import List

import numpy as np
import torch

from .config import ServeConfig
from .params import Request


class PagedKV:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        dt = getattr(torch, cfg.dtype)
        self.layers: List[torch.Tensor] = [
            torch.zeros(cfg.num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=dt, device=device)
            for _ in range(cfg.num_layers)
        ]
        self._free = list(range(cfg.num_pages - 1, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def grow(self, req: Request, seq_len: int) -> bool:
        need = -(-seq_len // self.page_size) - len(req.pages)
        if need > len(self._free):
            return False
        for _ in range(max(need, 0)):
            req.pages.append(self._free.pop())
        return True

    def free(self, req: Request) -> None:
        self._free.extend(reversed(req.pages))
        req.pages.clear()

    def csr(self, reqs: List[Request], seq_lens: np.ndarray):
        counts = np.array([len(r.pages) for r in reqs], dtype=np.int32)
        indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.fromiter((p for r in reqs for p in r.pages), dtype=np.int32, count=int(indptr[-1]))
        last = ((seq_lens - 1) % self.page_size + 1).astype(np.int32)
        return indptr, indices, last
