"""Which tokens and pages of a request live on this rank."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

from dcp.config import DCPConfig


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def local_seq_lens(seq_lens: torch.Tensor, rank: int, world: int, interleave: int = 1) -> torch.Tensor:
    """Tokens of each request stored on ``rank``; answers on the device of ``seq_lens``."""
    span = world * interleave
    full = torch.div(seq_lens, span, rounding_mode="floor")
    rem = seq_lens - full * span
    extra = (rem - rank * interleave).clamp(min=0, max=interleave)
    return full * interleave + extra


def local_last_page_len(local_lens: torch.Tensor, page_size: int) -> torch.Tensor:
    last = (local_lens - 1) % page_size + 1
    return torch.where(local_lens > 0, last, torch.zeros_like(last)).to(torch.int32)


def build_local_indptr(local_pages: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(local_pages.shape[0] + 1, dtype=torch.int32, device=local_pages.device)
    out[1:] = torch.cumsum(local_pages, dim=0)
    return out


def gather_local_pages(
    req_to_page: torch.Tensor, req_idx: torch.Tensor, local_pages: torch.Tensor, nnz: int
) -> torch.Tensor:
    """Flatten each request's local pages in order; ``nnz`` comes from the host mirror."""
    n = local_pages.shape[0]
    rows = torch.repeat_interleave(torch.arange(n, device=local_pages.device), local_pages, output_size=nnz)
    starts = torch.cumsum(local_pages, dim=0) - local_pages
    cols = torch.arange(nnz, device=local_pages.device) - starts[rows]
    return req_to_page[req_idx[rows], cols].to(torch.int32)


class ShardPageTable:
    """This rank's pages of every request: a host numpy table and its device mirror.

    Page 0 is the trash page: tokens this rank does not own are written there.
    """

    def __init__(self, cfg: DCPConfig, rank: int, device: torch.device):
        self.page_size = cfg.page_size
        self.rank = rank
        self.req_to_page_np = np.zeros((cfg.max_reqs, cfg.max_local_pages_per_seq), dtype=np.int32)
        self.req_to_page = torch.zeros((cfg.max_reqs, cfg.max_local_pages_per_seq), dtype=torch.int32, device=device)
        self.num_pages_np = np.zeros(cfg.max_reqs, dtype=np.int32)
        self._free: List[int] = list(range(cfg.num_local_pages - 1, 0, -1))

    def ensure(self, req_ids: List[int], local_lens: List[int]) -> None:
        for r, n in zip(req_ids, local_lens):
            need = cdiv(n, self.page_size)
            have = int(self.num_pages_np[r])
            if need <= have:
                continue
            if need - have > len(self._free):
                raise MemoryError(f"rank {self.rank}: shard pool exhausted ({len(self._free)} free pages)")
            new = np.array([self._free.pop() for _ in range(need - have)], dtype=np.int32)
            self.req_to_page_np[r, have:need] = new
            self.req_to_page[r, have:need].copy_(torch.from_numpy(new), non_blocking=True)
            self.num_pages_np[r] = need

    def release(self, r: int) -> None:
        have = int(self.num_pages_np[r])
        self._free.extend(self.req_to_page_np[r, :have].tolist())
        self.num_pages_np[r] = 0

    def slot_of(self, r: int, local_pos: int) -> int:
        return int(self.req_to_page_np[r, local_pos // self.page_size]) * self.page_size + local_pos % self.page_size
