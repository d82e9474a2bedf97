"""Decode metadata built from the host page lists each step."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

import numpy as np
import torch

from jsonmode import JsonModeConfig


@dataclass
class DecodeMeta:
    batch_size: int
    num_pages: int
    kv_indptr_host: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor  # device copy, read by the rotary position update
    kv_last_page_len_host: torch.Tensor
    schema_pages: int = 0


class JsonMetaBuilder:
    def __init__(self, cfg: JsonModeConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.indptr_pinned = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_pinned = torch.zeros(cfg.max_batch, dtype=torch.int32, pin_memory=True)
        self.indices_pinned = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, pin_memory=True)
        self.indices = torch.zeros(cfg.max_pages_per_step, dtype=torch.int32, device=device)

    def build(self, page_lists: Sequence[List[int]], seq_lens_np: np.ndarray) -> DecodeMeta:
        bs = len(page_lists)
        counts = np.fromiter((len(p) for p in page_lists), dtype=np.int32, count=bs)
        self.indptr_pinned.numpy()[1 : bs + 1] = np.cumsum(counts)
        n = int(counts.sum())
        if n:
            self.indices_pinned.numpy()[:n] = np.concatenate([np.asarray(p, np.int32) for p in page_lists])
        self.indices[:n].copy_(self.indices_pinned[:n], non_blocking=True)
        self.last_pinned.numpy()[:bs] = (seq_lens_np - 1) % self.cfg.page_size + 1
        last = self.last_pinned[:bs]
        return DecodeMeta(
            batch_size=bs,
            num_pages=n,
            kv_indptr_host=self.indptr_pinned[: bs + 1],
            kv_indices=self.indices[:n],
            kv_last_page_len=last.to(self.device, non_blocking=True),
            kv_last_page_len_host=last,
        )
