"""Paged KV of the committed prefix (prompt and finished blocks) of every request."""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import torch

from dllm.config import DLLMConfig


class PrefixKVCache:
    def __init__(self, cfg: DLLMConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        P = cfg.page_size
        self.kv = [
            torch.zeros(cfg.num_pages, 2, P, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.free: List[int] = list(range(cfg.num_pages - 1, -1, -1))
        self.pages: Dict[int, List[int]] = {}
        self.length: Dict[int, int] = {}

    def adopt(self, req: int, pages: List[int], length: int) -> None:
        """Take over a prompt prefilled elsewhere (its KV is already in ``pages``)."""
        self.pages[req] = list(pages)
        self.length[req] = length

    def reserve_block(self, req: int, block_len: int) -> List[int]:
        """Slots for the next block's tokens, right behind the committed prefix."""
        P = self.cfg.page_size
        start = self.length[req]
        end = start + block_len
        while len(self.pages[req]) * P < end:
            self.pages[req].append(self.free.pop())
        pages = self.pages[req]
        return [pages[t // P] * P + t % P for t in range(start, end)]

    def commit(self, req: int, block_len: int) -> None:
        self.length[req] += block_len

    def block_pages(self, req: int, block_len: int) -> Tuple[int, List[int]]:
        """(first page position, page ids) of the block just committed."""
        P = self.cfg.page_size
        end = self.length[req]
        first = (end - block_len) // P
        return first, self.pages[req][first : -(-end // P)]

    def page_table(self, reqs: List[int]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """indptr (host), indices (device), last_page_len (host) of the committed prefixes."""
        P = self.cfg.page_size
        lens = np.asarray([self.length[r] for r in reqs], dtype=np.int64)
        counts = -(-lens // P)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        indices = np.concatenate([np.asarray(self.pages[r][:c], dtype=np.int32) for r, c in zip(reqs, counts)])
        last = ((lens - 1) % P + 1).astype(np.int32)
        return (
            torch.from_numpy(indptr),
            torch.from_numpy(indices).to(self.device, non_blocking=True),
            torch.from_numpy(last),
        )

    def release(self, req: int) -> None:
        self.free.extend(self.pages.pop(req))
        self.length.pop(req)

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        P = self.cfg.page_size
        kv = self.kv[layer]
        kv[loc // P, 0, loc % P] = k
        kv[loc // P, 1, loc % P] = v
