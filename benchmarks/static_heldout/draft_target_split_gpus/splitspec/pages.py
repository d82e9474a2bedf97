"""A host page table mirrored to each GPU."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence

import numpy as np
import torch

from .config import SplitConfig


@dataclass
class PagesOnDevice:
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    num_pages: int = 0


@dataclass
class SpecBatch:
    slots: List[int]
    seq_lens_cpu: torch.Tensor
    last_tokens: torch.Tensor  # on the draft GPU
    draft_device: torch.device

    @property
    def lens_on_draft(self) -> torch.Tensor:
        return self.seq_lens_cpu.to(self.draft_device, non_blocking=True)


class PageTableMirror:
    def __init__(self, cfg: SplitConfig, devices: Sequence[torch.device]) -> None:
        self.cfg = cfg
        mb, mp = cfg.max_batch, cfg.max_pages_per_step
        self.indptr_host = torch.zeros(mb + 1, dtype=torch.int32, pin_memory=True)
        self.indices_host = torch.zeros(mp, dtype=torch.int32, pin_memory=True)
        self.last_len_host = torch.zeros(mb, dtype=torch.int32, pin_memory=True)
        self.per_device: Dict[torch.device, PagesOnDevice] = {
            d: PagesOnDevice(
                indptr=torch.zeros(mb + 1, dtype=torch.int32, device=d),
                indices=torch.zeros(mp, dtype=torch.int32, device=d),
                last_page_len=torch.ones(mb, dtype=torch.int32, device=d),
            )
            for d in devices
        }

    def load(self, page_lists: Sequence[List[int]], seq_lens_np: np.ndarray) -> int:
        bs = len(page_lists)
        counts = np.array([len(p) for p in page_lists], dtype=np.int32)
        self.indptr_host.numpy()[1 : bs + 1] = np.cumsum(counts)
        flat = np.concatenate([np.asarray(p, dtype=np.int32) for p in page_lists])
        self.indices_host.numpy()[: flat.size] = flat
        self.last_len_host.numpy()[:bs] = (seq_lens_np - 1) % self.cfg.page_size + 1
        return int(flat.size)

    def push(self, device: torch.device, bs: int, n_pages: int) -> PagesOnDevice:
        dst = self.per_device[device]
        dst.indptr[: bs + 1].copy_(self.indptr_host[: bs + 1], non_blocking=True)
        dst.indices[:n_pages].copy_(self.indices_host[:n_pages], non_blocking=True)
        dst.last_page_len[:bs].copy_(self.last_len_host[:bs], non_blocking=True)
        dst.num_pages = n_pages
        return dst

    def advance_last(self, device: torch.device, bs: int, steps: int) -> torch.Tensor:
        dst = self.per_device[device]
        return (dst.last_page_len[:bs] + steps - 1) % self.cfg.page_size + 1
