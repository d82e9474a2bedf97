"""Paged KV pool and the request-to-page table (host numpy, with a device copy)."""
from __future__ import annotations

from typing import List, Tuple

import numpy as np
import torch

from warmstart.config import RestartConfig


class ReqToPageTable:
    def __init__(self, cfg: RestartConfig, device: torch.device):
        self.cfg = cfg
        self.table_np = np.zeros((cfg.max_num_reqs, cfg.max_pages_per_req), dtype=np.int32)
        self.table_dev = torch.zeros(cfg.max_num_reqs, cfg.max_pages_per_req, dtype=torch.int32, device=device)
        # device copy of the table as loaded from the snapshot (rows are refreshed from it lazily)
        self.restored_dev = torch.zeros_like(self.table_dev)
        self.free_rows: List[int] = list(range(cfg.max_num_reqs - 1, -1, -1))

    def gather_host(self, rows: torch.Tensor, page_counts: np.ndarray) -> torch.Tensor:
        parts = [self.table_np[r, :c] for r, c in zip(rows.numpy(), page_counts)]
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
        return torch.from_numpy(flat).pin_memory()

    def refresh_device_rows(self, rows: torch.Tensor) -> None:
        self.table_dev.index_copy_(0, rows, self.restored_dev.index_select(0, rows))

    def load(self, table: np.ndarray, device: torch.device) -> None:
        self.table_np[: table.shape[0]] = table
        self.restored_dev[: table.shape[0]].copy_(torch.from_numpy(table).to(device))


class PagedKVPool:
    def __init__(self, cfg: RestartConfig, device: torch.device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        shape = (cfg.max_total_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.k_buffer = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]
        self.v_buffer = [torch.zeros(shape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]
        # pages of resumed requests that the loader thread has not paged in yet are served from here
        sshape = (cfg.max_staging_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.staging_k = [torch.zeros(sshape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]
        self.staging_v = [torch.zeros(sshape, dtype=cfg.dtype, device=device) for _ in range(cfg.num_layers)]
        self.staging_rows: List[List[int]] = [[] for _ in range(cfg.max_num_reqs)]
        self.free_pages: List[int] = list(range(cfg.max_total_pages - 1, -1, -1))

    def kv(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer], self.v_buffer[layer]

    def staging_kv(self, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.staging_k[layer], self.staging_v[layer]

    def set_kv(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k_buffer[layer].view(-1, *k.shape[1:]).index_copy_(0, loc, k)
        self.v_buffer[layer].view(-1, *v.shape[1:]).index_copy_(0, loc, v)

    def staging_layout(self, rows: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        indptr = np.zeros(len(rows) + 1, dtype=np.int32)
        pages: List[int] = []
        for i, r in enumerate(rows):
            pages.extend(self.staging_rows[r])
            indptr[i + 1] = len(pages)
        last = np.full(len(rows), self.page_size, dtype=np.int32)
        return indptr, np.asarray(pages, dtype=np.int32), last

    def used_pages(self) -> np.ndarray:
        used = np.ones(self.cfg.max_total_pages, dtype=np.bool_)
        used[self.free_pages] = False
        return np.flatnonzero(used).astype(np.int64)
