from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from lckv.config import OffloadConfig


@dataclass
class LongRequest:
    req_id: int
    last_token: int
    seq_len: int
    host_pages: List[int]
    summary_slots: List[int] = field(default_factory=list)

    def window_pages(self, sink: int, recent: int) -> np.ndarray:
        pages = self.host_pages
        if len(pages) <= sink + recent:
            return np.asarray(pages, dtype=np.int64)
        return np.asarray(pages[:sink] + pages[-recent:], dtype=np.int64)

    def window_len(self, sink: int, recent: int, page_size: int) -> int:
        n = len(self.window_pages(sink, recent))
        return (n - 1) * page_size + (self.seq_len - 1) % page_size + 1


class HostPagePool:
    """Cold KV pages in pinned host memory, one tensor per layer."""

    def __init__(self, num_pages: int, cfg: OffloadConfig):
        assert num_pages > 0 and num_pages % cfg.chunk_pages == 0, "pool must hold whole chunks"  # expect: FC109
        self.num_pages = num_pages
        shape = (num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [torch.empty(shape, dtype=cfg.dtype, pin_memory=True) for _ in range(cfg.num_layers)]
        self._free = list(range(num_pages - 1, -1, -1))

    def _take(self) -> int:
        assert self._free, "host KV pool exhausted"  # ok: FC109
        return self._free.pop()

    def alloc(self, n: int) -> List[int]:
        return [self._take() for _ in range(n)]

    def release(self, pages: List[int]) -> None:
        self._free.extend(pages)
