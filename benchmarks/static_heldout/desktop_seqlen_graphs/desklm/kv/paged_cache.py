"""KV pages of the one live sequence: page i of the sequence is page i of the pool."""
from __future__ import annotations

import numpy as np
import torch
from flashinfer.page import append_paged_kv_cache

from desklm.settings import DeskSettings


class SingleSeqKVCache:
    def __init__(self, s: DeskSettings, device: torch.device):
        self.s = s
        self.device = device
        self.caches = [
            torch.zeros(s.max_pages, 2, s.page_size, s.num_kv_heads, s.head_dim, dtype=torch.float16, device=device)
            for _ in range(s.num_layers)
        ]
        self.seq_len = 0                                      # host truth
        self.seq_len_gpu = torch.zeros(1, dtype=torch.int32, device=device)
        self.kv_len_cpu = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.page_ids = torch.arange(s.max_pages, dtype=torch.int32, device=device)
        self.page_ids_np = np.arange(s.max_pages, dtype=np.int32)
        self.batch_idx = torch.zeros(1, dtype=torch.int32, device=device)

    def reset(self) -> None:
        self.seq_len = 0
        self.seq_len_gpu.zero_()

    def num_pages(self, n: int) -> int:
        return -(-n // self.s.page_size)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, indptr: torch.Tensor, last_page: torch.Tensor) -> None:
        append_paged_kv_cache(k, v, self.batch_idx.expand(k.shape[0]), positions, self.caches[layer], self.page_ids, indptr, last_page)

    def advance(self, n: int) -> None:
        self.seq_len += n
        self.kv_len_cpu[0] = self.seq_len
        self.seq_len_gpu.add_(n)
