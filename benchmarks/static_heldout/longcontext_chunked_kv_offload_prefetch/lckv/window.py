from dataclasses import dataclass
from typing import List

import numpy as np
import torch

from lckv.config import OffloadConfig
from lckv.host_pool import HostPagePool


@dataclass
class WindowView:
    """What one decode step reads: slot ids of its window pages, host indptr
    and last-page lengths for the plan, the copies the prefetcher must issue."""

    num_reqs: int
    num_pages: int
    indptr_host: torch.Tensor
    last_page_host: torch.Tensor
    slot_ids: torch.Tensor
    copy_src_np: np.ndarray
    copy_dst_np: np.ndarray
    summary_indptr: torch.Tensor
    summary_indices: torch.Tensor
    summary_last_host: torch.Tensor


class DeviceWindow:
    def __init__(self, cfg: OffloadConfig):
        self.device = torch.device(cfg.device)
        self.num_slots = cfg.window_slots
        shape = (cfg.window_slots, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [torch.zeros(shape, dtype=cfg.dtype, device=self.device) for _ in range(cfg.num_layers)]
        sshape = (cfg.max_summary_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.summary_kv = [torch.zeros(sshape, dtype=cfg.dtype, device=self.device) for _ in range(cfg.num_layers)]
        self.resident = torch.zeros(cfg.host_pages, dtype=torch.int8, device=self.device)
        self.hit_count = torch.zeros((), dtype=torch.int64, device=self.device)

    @property
    def occupancy(self) -> torch.Tensor:
        return (self.resident > 0).sum()

    def grow(self, extra_slots: int) -> None:
        assert self.num_slots == self.kv[0].shape[0]  # ok: FC109
        for layer in range(len(self.kv)):
            pad = self.kv[layer].new_zeros((extra_slots,) + tuple(self.kv[layer].shape[1:]))
            self.kv[layer] = torch.cat([self.kv[layer], pad])  # expect: FC107
        self.num_slots += extra_slots


class SlotRemapper:
    """Maps each step's window pages to device slots (host LRU), and builds
    the step's view; misses become copies for the prefetcher."""

    def __init__(self, window: DeviceWindow, pool: HostPagePool, slot_table: torch.Tensor, cfg: OffloadConfig):
        self.window = window
        self.pool = pool
        self.cfg = cfg
        self.device = window.device
        self.slot_table = slot_table  # the decode graphs' paged_kv_indices
        self.slot_of_page_np = np.full(pool.num_pages, -1, dtype=np.int64)
        self.page_of_slot_np = np.full(window.num_slots, -1, dtype=np.int64)
        self.last_use_np = np.zeros(window.num_slots, dtype=np.int64)
        self._free_slots: List[int] = list(range(window.num_slots - 1, -1, -1))
        self._clock = 0
        self.indptr_host = torch.zeros(max(cfg.decode_buckets) + 1, dtype=torch.int32, pin_memory=True)
        self.last_host = torch.ones(max(cfg.decode_buckets), dtype=torch.int32, pin_memory=True)

    def _evict_one(self, in_use: np.ndarray) -> bool:
        order = np.argsort(self.last_use_np)
        for s in order:
            if self.page_of_slot_np[s] >= 0 and s not in in_use:
                self.slot_of_page_np[self.page_of_slot_np[s]] = -1
                self.page_of_slot_np[s] = -1
                self._free_slots.append(int(s))
                return True
        return False

    def _assign(self, cold: np.ndarray, in_use: np.ndarray) -> np.ndarray:
        dst = np.empty(cold.size, dtype=np.int64)
        for i, p in enumerate(cold):
            if int(self.slot_of_page_np[p]) >= 0:  # ok: FC101
                dst[i] = self.slot_of_page_np[p]
                continue
            if not self._free_slots and not self._evict_one(in_use):
                start = self.window.num_slots
                self.window.grow(self.cfg.grow_slots)
                self.page_of_slot_np = np.concatenate([self.page_of_slot_np, np.full(self.cfg.grow_slots, -1)])
                self.last_use_np = np.concatenate([self.last_use_np, np.zeros(self.cfg.grow_slots, np.int64)])
                self._free_slots.extend(range(self.window.num_slots - 1, start - 1, -1))
            s = self._free_slots.pop()
            self.slot_of_page_np[p], self.page_of_slot_np[s] = s, p
            dst[i] = s
        return dst

    def remap(self, page_lists: List[np.ndarray], seq_lens_np: np.ndarray, summary_lists: List[List[int]]) -> WindowView:
        self._clock += 1
        n = len(page_lists)
        flat = np.concatenate(page_lists)
        in_use = self.slot_of_page_np[flat]
        cold = np.unique(flat[in_use < 0])
        dst = self._assign(cold, in_use[in_use >= 0])
        slots = self.slot_of_page_np[flat]
        self.last_use_np[slots] = self._clock

        page_ids = torch.from_numpy(flat).to(self.device, non_blocking=True)
        slot_ids = torch.from_numpy(slots.astype(np.int32)).to(self.device, non_blocking=True)
        hit = self.window.resident[page_ids] > 0
        self.window.hit_count += hit.sum()  # ok: FC101
        missing = page_ids[~hit]  # expect: FC101
        self.window.resident[missing] = 1
        # patch the graphs' slot table right away, the plan only refreshes indptr
        self.slot_table[: flat.size].copy_(slot_ids, non_blocking=True)  # expect: FC104

        indptr = self.indptr_host[: n + 1]
        indptr[0] = 0
        indptr[1:] = torch.from_numpy(np.cumsum([p.size for p in page_lists]).astype(np.int32))
        last = self.last_host[:n]
        last.copy_(torch.from_numpy(((seq_lens_np - 1) % self.cfg.page_size + 1).astype(np.int32)))

        seq_dev = torch.from_numpy(seq_lens_np).to(self.device, non_blocking=True)
        chunks_dev = torch.clamp(seq_dev // self.cfg.chunk_tokens, min=1).int()
        summary_indptr = torch.nn.functional.pad(torch.cumsum(chunks_dev, 0, dtype=torch.int32), (1, 0))
        summary_np = np.concatenate([np.asarray(s, dtype=np.int32) for s in summary_lists])
        return WindowView(
            num_reqs=n, num_pages=flat.size, indptr_host=indptr, last_page_host=last, slot_ids=slot_ids,
            copy_src_np=cold, copy_dst_np=dst, summary_indptr=summary_indptr,
            summary_indices=torch.from_numpy(summary_np).to(self.device, non_blocking=True),
            summary_last_host=torch.full((n,), self.cfg.page_size, dtype=torch.int32))
