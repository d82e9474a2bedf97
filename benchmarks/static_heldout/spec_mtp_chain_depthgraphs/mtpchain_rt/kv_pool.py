"""Paged KV pool with numpy page tables (the host owns allocation)."""

from typing import Dict, List

import numpy as np
import torch

from mtpchain.config import MTPConfig


class PagedKVPool:
    def __init__(self, cfg: MTPConfig, num_pages: int, device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        self.kv_cache = torch.zeros(
            cfg.num_layers + cfg.num_mtp_heads, num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.page_table = torch.zeros(cfg.max_batch_size, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.page_table_np = np.zeros((cfg.max_batch_size, cfg.max_pages_per_seq), dtype=np.int32)
        self.seq_lens_np = np.zeros(cfg.max_batch_size, dtype=np.int64)
        self._free: List[int] = list(range(num_pages - 1, 0, -1))
        self._slot_of: Dict[int, int] = {}

    def alloc_pages(self, n: int) -> List[int]:
        assert len(self._free) + len(self._slot_of) > 0, "pool was never initialised"  # ok: FC109
        if n > len(self._free):
            raise RuntimeError(f"KV pool exhausted: need {n} pages, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        return out

    def attach(self, req_id: int, slot: int, prompt_len: int) -> None:
        n = (prompt_len + self.page_size - 1) // self.page_size
        pages = self.alloc_pages(n)
        self.page_table_np[slot, :n] = pages
        self.seq_lens_np[slot] = prompt_len
        self._slot_of[req_id] = slot

    def grow(self, slot: int, new_len: int) -> None:
        have = (int(self.seq_lens_np[slot]) + self.page_size - 1) // self.page_size
        need = (new_len + self.page_size - 1) // self.page_size
        if need > have:
            self.page_table_np[slot, have:need] = self.alloc_pages(need - have)
        self.seq_lens_np[slot] = new_len

    def tail_pages(self, slots: List[int], depth: int) -> List[np.ndarray]:
        out = []
        for s in slots:
            end = int(self.seq_lens_np[s]) + depth
            first = int(self.seq_lens_np[s]) // self.page_size
            last = (end + self.page_size - 1) // self.page_size
            out.append(self.page_table_np[s, first:last].copy())
        return out

    def sync_page_table(self, bs: int) -> None:
        self.page_table[:bs].copy_(torch.from_numpy(self.page_table_np[:bs]), non_blocking=True)
