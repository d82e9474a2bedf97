"""Paged KV with holes: eviction frees pages in the middle of a request; compaction closes the holes between
steps and the flattened page table is rebuilt."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from h2o.policy.budget import PAGE_SIZE


class CompressedPagePool:
    def __init__(self, num_pages: int, max_batch: int, max_pages_per_req: int, device: torch.device):
        self.device = device
        self.max_pages_per_req = max_pages_per_req
        self._kv_layout = "NHD"
        self.page_table = torch.full((max_batch, max_pages_per_req), -1, dtype=torch.int32, device=device)
        self.used_pages = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.used_pages_host = torch.zeros(max_batch, dtype=torch.int32, pin_memory=True)
        self.free_stack = torch.arange(num_pages, dtype=torch.int32, device=device)
        self.free_top = num_pages
        self.page_indptr = torch.zeros(max_batch + 1, dtype=torch.int32, device=device)
        self.page_indices = torch.zeros(max_batch * max_pages_per_req, dtype=torch.int32, device=device)
        self.last_page_len = torch.ones(max_batch, dtype=torch.int32, device=device)
        self.page_indptr_host = torch.zeros(max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_batch, dtype=torch.int32, pin_memory=True)

    def append_page(self, rows_np: np.ndarray) -> None:
        """Rows whose last page is full get one new page (host-driven; the counts live on the host)."""
        n = len(rows_np)
        if n == 0:
            return
        rows = torch.from_numpy(rows_np).to(self.device, non_blocking=True)
        cols = torch.from_numpy(self.used_pages_host.numpy()[rows_np]).to(self.device, non_blocking=True)
        self.page_table[rows, cols.long()] = self.free_stack[self.free_top - n : self.free_top]
        self.free_top -= n
        self.used_pages[rows] += 1
        self.used_pages_host[torch.from_numpy(rows_np)] += 1

    def evict(self, bs: int, victims: torch.Tensor) -> None:
        rows = torch.arange(bs, device=self.device)[:, None].expand_as(victims)
        freed = self.page_table[rows, victims].flatten()
        self.page_table[rows, victims] = -1
        n = victims.numel()
        self.free_stack[self.free_top : self.free_top + n] = freed
        self.free_top += n
        self.used_pages[:bs] -= victims.shape[1]
        self.used_pages_host[:bs] -= victims.shape[1]

    def compact(self, bs: int, out_indices: torch.Tensor) -> None:
        """Move holes to the end of every row and write the flattened page table into ``out_indices``."""
        table = self.page_table[:bs]
        holes = torch.argwhere(table < 0)  # expect: FC101
        if holes.numel() == 0:
            return
        order = torch.argsort((table < 0).to(torch.int8), dim=1, stable=True)
        self.page_table[:bs].copy_(torch.gather(table, 1, order))
        n_np = self.used_pages_host[:bs].numpy()
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(n_np, out=indptr_np[1:])
        total = int(indptr_np[-1])
        row_ids = torch.from_numpy(np.repeat(np.arange(bs), n_np)).to(self.device, non_blocking=True)
        col_ids = torch.from_numpy(np.concatenate([np.arange(k) for k in n_np])).to(self.device, non_blocking=True)
        out_indices[:total].copy_(self.page_table[row_ids, col_ids])
        self.page_indptr_host[: bs + 1] = torch.from_numpy(indptr_np)
        self.page_indptr[: bs + 1].copy_(self.page_indptr_host[: bs + 1], non_blocking=True)

    def flatten(self, bs: int, lens_np: np.ndarray) -> Tuple[int, np.ndarray]:
        n_np = self.used_pages_host[:bs].numpy()
        indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(n_np, out=indptr_np[1:])
        total = int(indptr_np[-1])
        row_ids = torch.from_numpy(np.repeat(np.arange(bs), n_np)).to(self.device, non_blocking=True)
        col_ids = torch.from_numpy(np.concatenate([np.arange(k) for k in n_np])).to(self.device, non_blocking=True)
        self.page_indices[:total].copy_(self.page_table[row_ids, col_ids])
        self.page_indptr_host[: bs + 1] = torch.from_numpy(indptr_np)
        self.page_indptr[: bs + 1].copy_(self.page_indptr_host[: bs + 1], non_blocking=True)
        last_np = ((lens_np - 1) % PAGE_SIZE + 1).astype(np.int32)
        self.last_page_len_host[:bs] = torch.from_numpy(last_np)
        self.last_page_len[:bs].copy_(self.last_page_len_host[:bs], non_blocking=True)
        return total, indptr_np
