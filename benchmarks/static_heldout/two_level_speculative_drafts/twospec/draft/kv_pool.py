"""The draft model's own paged KV pool (HND pages) and page lists."""

from typing import List

import numpy as np
import torch

from ..config import SpecConfig


class DraftKVPool:
    def __init__(self, cfg: SpecConfig) -> None:
        dev = cfg.device
        max_bs = cfg.max_batch_size
        self.page_size = cfg.page_size
        self.max_pages = cfg.max_pages_per_seq()
        self.kv_cache = [
            torch.zeros(
                cfg.draft_pages, 2, cfg.draft_kv_heads, cfg.page_size, cfg.draft_head_dim, dtype=torch.bfloat16, device=dev
            )
            for _ in range(cfg.draft_layers)
        ]
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_bs * self.max_pages, dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.page_table = torch.zeros(max_bs, self.max_pages, dtype=torch.int32, device=dev)
        self.page_table_np = np.zeros((max_bs, self.max_pages), dtype=np.int32)
        # committed lengths (accepted tokens) and lengths including this step's drafts
        self.committed_lens = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=dev)
        self.seq_lens_cpu = np.zeros(max_bs, dtype=np.int32)
        self._free: List[int] = list(range(cfg.draft_pages - 1, 0, -1))

    def assign_row(self, row: int, n_pages: int) -> None:
        pages = [self._free.pop() for _ in range(n_pages)]
        self.page_table_np[row, :n_pages] = pages
        self.page_table[row, :n_pages].copy_(torch.tensor(pages, dtype=torch.int32), non_blocking=True)

    def release_row(self, row: int, n_pages: int) -> None:
        self._free.extend(self.page_table_np[row, :n_pages].tolist())
        self.page_table_np[row, :n_pages] = 0
