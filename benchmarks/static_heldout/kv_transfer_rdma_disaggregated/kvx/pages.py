"""Maps received pages into the decode node's page table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

import numpy as np
import torch

from .config import TransferConfig


@dataclass
class TransferManifest:
    rid: int
    slot: int
    seq: int
    num_pages: int
    last_page_len: int
    seq_len: int
    first_token: int
    region_offset: int
    tail_tokens: int = 0


@dataclass
class DecodePageTable:
    kv_indptr: torch.Tensor
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    last_page_len: torch.Tensor
    last_page_len_host: torch.Tensor


class PageMapper:
    def __init__(self, cfg: TransferConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.free_pages: List[int] = list(range(cfg.max_pages))
        self.req_pages: Dict[int, np.ndarray] = {}
        self.req_last: Dict[int, int] = {}
        self.page_ids = torch.zeros(cfg.max_pages_per_transfer, dtype=torch.int32, device=device)
        n = cfg.max_batch
        self.table = DecodePageTable(
            kv_indptr=torch.zeros(n + 1, dtype=torch.int32, device=device),
            kv_indptr_host=torch.zeros(n + 1, dtype=torch.int32, pin_memory=True),
            kv_indices=torch.zeros(cfg.max_pages, dtype=torch.int32, device=device),
            last_page_len=torch.ones(n, dtype=torch.int32, device=device),
            last_page_len_host=torch.ones(n, dtype=torch.int32, pin_memory=True),
        )

    def map_pages(self, manifest: TransferManifest, src_pages: np.ndarray) -> np.ndarray:
        assert len(src_pages) == manifest.num_pages, "manifest and page list disagree"  # expect: FC109
        local = np.array([self.free_pages.pop() for _ in range(len(src_pages))], dtype=np.int32)
        self.req_pages[manifest.rid] = local
        self.req_last[manifest.rid] = manifest.last_page_len
        return local

    def release(self, rid: int) -> None:
        self.free_pages.extend(self.req_pages.pop(rid).tolist())
        self.req_last.pop(rid, None)
        self._check_pool()

    def _check_pool(self) -> None:
        in_use = sum(len(p) for p in self.req_pages.values())
        assert len(self.free_pages) + in_use == self.cfg.max_pages, "page leaked or freed twice"  # ok: FC109

    def rebuild(self, rids: List[int]) -> int:
        lens = np.array([len(self.req_pages[r]) for r in rids], dtype=np.int32)
        n = len(rids)
        t = self.table
        t.kv_indptr_host[0] = 0
        t.kv_indptr_host[1 : n + 1] = torch.from_numpy(np.cumsum(lens, dtype=np.int32))
        t.last_page_len_host[:n] = torch.tensor([self.req_last[r] for r in rids], dtype=torch.int32)
        nnz = int(lens.sum())
        flat = torch.from_numpy(np.concatenate([self.req_pages[r] for r in rids]))
        t.kv_indices[:nnz].copy_(flat, non_blocking=True)
        t.kv_indptr[: n + 1].copy_(t.kv_indptr_host[: n + 1], non_blocking=True)
        t.last_page_len[:n].copy_(t.last_page_len_host[:n], non_blocking=True)
        return nnz
