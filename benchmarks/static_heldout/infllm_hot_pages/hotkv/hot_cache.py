"""GPU hot cache: a fixed number of page slots holding the pages attended this step."""

from __future__ import annotations

import logging
from typing import Dict, List, Optional

import numpy as np
import torch

from hotkv.host_pool import HostKVPool

logger = logging.getLogger(__name__)


class HotPageCache:
    def __init__(self, host: HostKVPool, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 device: torch.device, graph_indices: torch.Tensor):
        self.host = host
        self.num_slots = num_slots
        self.device = device
        ps = host.page_size
        self.kv = torch.zeros(num_layers, num_slots, 2, ps, num_kv_heads, head_dim,
                              dtype=torch.bfloat16, device=device)
        # host page id -> GPU slot (-1: not resident); device copy for the gather kernels
        self.slot_of_page = torch.full((host.num_pages,), -1, dtype=torch.int32, device=device)
        self.slot_of_page_cpu = torch.full((host.num_pages,), -1, dtype=torch.int32)
        self.slot_of_page_np = self.slot_of_page_cpu.numpy()
        self.page_of_slot_np = np.full(num_slots, -1, dtype=np.int64)
        self.lru_stamp_np = np.zeros(num_slots, dtype=np.int64)
        self.lru_stamp_cpu = torch.from_numpy(self.lru_stamp_np)
        self.pinned_slots_np = np.zeros(num_slots, dtype=bool)
        self.hit_counts = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.hit_counts_host = torch.zeros(num_slots, dtype=torch.int64, pin_memory=True)
        # the graph decode wrappers' page index buffer: slots are remapped in it when pages move
        self.graph_indices = graph_indices
        self.copy_stream = torch.cuda.Stream(device=device)
        self.clock = 0

    def admit(self, page_ids_cpu: np.ndarray, page_ids_gpu: torch.Tensor) -> np.ndarray:
        """Make every page in `page_ids_cpu` resident; returns their slots (host)."""
        self.clock += 1
        if page_ids_cpu.max(initial=-1) >= self.slot_of_page.numel():
            new_n = self.host.num_pages
            logger.info("host pool grew to %d pages; growing the slot map", new_n)
            old = self.slot_of_page
            self.slot_of_page = torch.full((new_n,), -1, dtype=torch.int32, device=self.device)  # expect: FC107
            self.slot_of_page[: old.numel()] = old
            self.slot_of_page_cpu = torch.full((new_n,), -1, dtype=torch.int32)  # ok: FC107
            self.slot_of_page_cpu[: len(self.slot_of_page_np)] = torch.from_numpy(self.slot_of_page_np)
            self.slot_of_page_np = self.slot_of_page_cpu.numpy()

        missing_gpu = page_ids_gpu[self.slot_of_page[page_ids_gpu] < 0]  # expect: FC101
        slots = self.slot_of_page_np[page_ids_cpu]
        missing_cpu = slots < 0
        n_missing = int(missing_cpu.sum())  # ok: FC101
        if n_missing:
            victims = self._lru_victims(n_missing)
            if (self.lru_stamp_np[victims] == self.clock).any():  # ok: FC101
                raise RuntimeError(f"hot cache thrashing: {n_missing} misses, hits {self.hit_counts}")  # ok: FC101
            new_pages = page_ids_cpu[missing_cpu]
            self._page_in(new_pages, victims)
            pos = torch.from_numpy(np.flatnonzero(missing_cpu)).to(self.device, non_blocking=True)  # ok: FC101
            self.graph_indices.index_copy_(0, pos, torch.from_numpy(victims.astype(np.int32)).to(self.device))  # expect: FC104
            slots = self.slot_of_page_np[page_ids_cpu]
        self.lru_stamp_np[slots] = self.clock
        self.hit_counts.index_add_(0, torch.from_numpy(slots).to(self.device, non_blocking=True),
                                   torch.ones(len(slots), dtype=torch.int64, device=self.device))
        self.hit_counts_host.copy_(self.hit_counts)  # expect: FC101
        logger.debug("admit: %d pages, %d misses, %d gpu-side", len(slots), n_missing, missing_gpu.numel())
        return slots

    def _lru_victims(self, n: int) -> np.ndarray:
        order = np.argsort(np.where(self.pinned_slots_np, np.iinfo(np.int64).max, self.lru_stamp_np))
        return order[:n]

    def _page_in(self, pages: np.ndarray, slots: np.ndarray) -> None:
        old = self.page_of_slot_np[slots]
        self.slot_of_page_np[old[old >= 0]] = -1
        self.slot_of_page_np[pages] = slots
        self.page_of_slot_np[slots] = pages
        src = self.host.kv[:, torch.from_numpy(pages)]
        with torch.cuda.stream(self.copy_stream):
            dst_idx = torch.from_numpy(slots).to(self.device, non_blocking=True)
            self.kv.index_copy_(1, dst_idx, src.to(self.device, non_blocking=True))
            self.slot_of_page.index_fill_(0, torch.from_numpy(pages).to(self.device, non_blocking=True), -1)
            self.slot_of_page[torch.from_numpy(pages).to(self.device, non_blocking=True)] = dst_idx.int()
        torch.cuda.current_stream().wait_stream(self.copy_stream)

    def dump_stats(self) -> Dict[str, float]:
        hits = self.hit_counts.sum().item()  # ok: FC101
        return {"hits": hits, "resident": float((self.page_of_slot_np >= 0).sum())}
