"""Paged KV pool (HND pages) with host-side page tables."""
from __future__ import annotations

from typing import Dict, List

import torch

from lpserve.batch import HostPageMeta
from lpserve.config import ServeConfig


class PagePool:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg = cfg
        self.page_size = cfg.page_size
        shape = (cfg.max_pages, cfg.num_kv_heads, cfg.page_size, cfg.head_dim)
        self.kv_cache = [
            (torch.zeros(shape, dtype=cfg.dtype, device=device), torch.zeros(shape, dtype=cfg.dtype, device=device))
            for _ in range(cfg.num_layers)
        ]
        # where this step's token of each row goes (read by the decode graph)
        self.out_page = torch.zeros(cfg.max_batch_size, dtype=torch.long, device=device)
        self.out_off = torch.zeros(cfg.max_batch_size, dtype=torch.long, device=device)
        self.out_page_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.long, pin_memory=True)
        self.out_off_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.long, pin_memory=True)
        self.prefill_page = torch.zeros(cfg.max_batch_size * 1024, dtype=torch.long, device=device)
        self.prefill_off = torch.zeros(cfg.max_batch_size * 1024, dtype=torch.long, device=device)
        self.free: List[int] = list(range(cfg.max_pages - 1, -1, -1))
        self.pages: Dict[int, List[int]] = {}
        self.lens: Dict[int, int] = {}

    def alloc_request(self, rid: int, prompt_len: int) -> None:
        need = (prompt_len + self.page_size - 1) // self.page_size
        if need > len(self.free):
            raise MemoryError(f"request {rid} needs {need} pages, {len(self.free)} free")
        self.pages[rid] = [self.free.pop() for _ in range(need)]
        self.lens[rid] = prompt_len

    def advance(self, rid: int) -> None:
        if self.lens[rid] % self.page_size == 0:
            self.pages[rid].append(self.free.pop())
        self.lens[rid] += 1

    def rollback(self, rid: int) -> None:
        self.lens[rid] -= 1
        if self.lens[rid] % self.page_size == 0:
            self.free.append(self.pages[rid].pop())

    def release(self, rid: int) -> None:
        self.free.extend(self.pages.pop(rid, []))
        self.lens.pop(rid, None)

    def host_metadata(self, rids: List[int]) -> HostPageMeta:
        indptr, indices, last, out_pages, out_offs = [0], [], [], [], []
        for rid in rids:
            n = self.lens[rid]
            pages = self.pages[rid][: (n + self.page_size - 1) // self.page_size]
            indices.extend(pages)
            indptr.append(len(indices))
            last.append((n - 1) % self.page_size + 1)
            out_pages.append(pages[-1])
            out_offs.append((n - 1) % self.page_size)
        return HostPageMeta(indptr, indices, last, out_pages, out_offs)

    def stage_out_slots(self, meta: HostPageMeta) -> None:
        n = len(meta.out_pages)
        self.out_page_cpu[:n].copy_(torch.tensor(meta.out_pages, dtype=torch.long))
        self.out_off_cpu[:n].copy_(torch.tensor(meta.out_offsets, dtype=torch.long))
        self.out_page[:n].copy_(self.out_page_cpu[:n], non_blocking=True)
        self.out_off[:n].copy_(self.out_off_cpu[:n], non_blocking=True)

    def stage_prefill_slots(self, rids: List[int], prompt_lens: List[int]) -> int:
        pages, offs = [], []
        for rid, n in zip(rids, prompt_lens):
            for pos in range(n):
                pages.append(self.pages[rid][pos // self.page_size])
                offs.append(pos % self.page_size)
        total = len(pages)
        self.prefill_page[:total].copy_(torch.tensor(pages, dtype=torch.long), non_blocking=True)
        self.prefill_off[:total].copy_(torch.tensor(offs, dtype=torch.long), non_blocking=True)
        return total

    def write_decode_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor, bs: int) -> None:
        k_cache, v_cache = self.kv_cache[layer]
        k_cache[self.out_page[:bs], :, self.out_off[:bs]] = k
        v_cache[self.out_page[:bs], :, self.out_off[:bs]] = v

    def write_prefill_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        total = k.shape[0]
        k_cache, v_cache = self.kv_cache[layer]
        k_cache[self.prefill_page[:total], :, self.prefill_off[:total]] = k
        v_cache[self.prefill_page[:total], :, self.prefill_off[:total]] = v
