"""Async page prefetch: before each step, bring the scheduled batch's pages onto the GPU.

NVMe -> pinned host happens on a reader thread ahead of time; pinned host -> GPU runs on
``copy_stream`` and the compute stream waits on ``ready_event`` before attention.
"""

import logging
import threading
from typing import TYPE_CHECKING, Dict, List, Optional

import numpy as np
import torch

from kvtier.config import TIER_CPU, TIER_GPU, TierConfig
from kvtier.page_table import TieredPageTable
from kvtier.tools.nvme_io import NvmeStore, evict_async, evict_to_host, scatter_pages

if TYPE_CHECKING:
    from kvtier_engine.attention import TieredAttention
    from kvtier_engine.server import StepBatch

logger = logging.getLogger(__name__)


class AsyncPrefetcher:
    def __init__(self, cfg: TierConfig, table: TieredPageTable, store: NvmeStore, kv_cache: torch.Tensor,
                 attn: "TieredAttention", device):
        self.cfg = cfg
        self.table = table
        self.store = store
        self.kv_cache = kv_cache
        self.attn = attn
        self.device = device
        self.copy_stream = torch.cuda.Stream(device=device)
        self.evict_stream = torch.cuda.Stream(device=device)
        self.ready_event = torch.cuda.Event()
        slab = (cfg.num_layers,) + tuple(kv_cache.shape[2:])
        self.host_pool = torch.empty((cfg.num_cpu_pages,) + slab, dtype=kv_cache.dtype, pin_memory=True)
        self.stage_host = torch.empty((1024,) + slab, dtype=kv_cache.dtype, pin_memory=True)
        self.stage_dev = torch.empty((1024,) + slab, dtype=kv_cache.dtype, device=device)
        self._nvme_q: List[np.ndarray] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._reader_loop, daemon=True)
        self._reader.start()

    # ------------------------------------------------------------ reader thread
    def _reader_loop(self) -> None:
        while True:
            with self._lock:
                todo = self._nvme_q.pop(0) if self._nvme_q else None
            if todo is None:
                threading.Event().wait(0.0005)
                continue
            cpu_slots = self.table.take_cpu_slots(len(todo))
            for i, (pid, slot) in enumerate(zip(todo, cpu_slots)):
                self.store.read_pages(np.array([pid]), self.host_pool[int(slot) : int(slot) + 1])
            self.table.mark(todo, TIER_CPU, cpu_slots)

    def enqueue_nvme(self, page_ids_np: np.ndarray) -> None:
        with self._lock:
            self._nvme_q.append(page_ids_np)

    # ------------------------------------------------------------- per step
    def prefetch_for_step(self, batch: "StepBatch") -> None:
        page_ids = batch.page_ids_dev
        missing = page_ids[self.table.tier_dev[page_ids] != TIER_GPU]  # expect: FC101
        on_cpu, on_nvme = self.table.classify(batch.page_ids_np)
        ids_cpu = torch.from_numpy(on_cpu)
        uniq = torch.unique(ids_cpu).tolist()  # ok: FC101
        if len(on_nvme):
            self.enqueue_nvme(on_nvme)
        n = len(uniq)
        if n == 0:
            self.ready_event.record(torch.cuda.current_stream())
            return
        if n > self.stage_dev.shape[0]:
            self.stage_dev = torch.empty((2 * n,) + tuple(self.stage_dev.shape[1:]), dtype=self.kv_cache.dtype, device=self.device)  # expect: FC107
            self.stage_host = torch.empty((2 * n,) + tuple(self.stage_host.shape[1:]), dtype=self.kv_cache.dtype, pin_memory=True)  # ok: FC107
        gpu_slots, victims = self.table.take_gpu_slots(n)
        if len(victims):
            self.make_room(victims)
        src = self.table.slot_np[np.array(uniq, dtype=np.int64)]
        torch.index_select(self.host_pool, 0, torch.from_numpy(src), out=self.stage_host[:n])
        with torch.cuda.stream(self.copy_stream):
            self.stage_dev[:n].copy_(self.stage_host[:n], non_blocking=True)
            slots_dev = torch.from_numpy(gpu_slots).to(self.device, non_blocking=True)
            scatter_pages(self.stage_dev[:n], self.kv_cache.transpose(0, 1), slots_dev)
            self.ready_event.record(self.copy_stream)
        self.table.mark(np.array(uniq, dtype=np.int64), TIER_GPU, gpu_slots)
        self.table.push_mirror(np.array(uniq, dtype=np.int64), self.device)
        batch.page_counts_dev = torch.from_numpy(batch.page_counts_np).to(self.device, non_blocking=True)  # ok: FC107
        # rewrite the batch's page slots now that the misses have landed
        new_slots = self.table.slot_dev[page_ids]
        self.attn.extend_kv_indices[: new_slots.shape[0]].copy_(new_slots)  # ok: FC104
        pos = batch.decode_positions_dev
        self.attn.kv_indices[pos] = new_slots[: pos.shape[0]]  # expect: FC104
        logger.debug("prefetched %d pages (%d missing on device)", n, missing.numel())

    def make_room(self, victims_np: np.ndarray) -> None:
        slots = torch.from_numpy(self.table.slot_np[victims_np]).to(self.device)
        cpu_slots = self.table.take_cpu_slots(len(victims_np))
        start = int(cpu_slots[0])
        if len(victims_np) > 64:
            evict_async(self.kv_cache, slots, self.host_pool, start, self.evict_stream)
        else:
            evict_to_host(self.kv_cache, slots, self.host_pool, start)

    def fence(self) -> None:
        torch.cuda.current_stream().wait_event(self.ready_event)  # ok: FC101

    def drain(self) -> None:
        # eviction may reuse GPU slots the last prefetch is still filling
        self.ready_event.synchronize()  # expect: FC101
