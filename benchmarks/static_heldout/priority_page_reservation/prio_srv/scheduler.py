"""Priority scheduler: high-priority requests are admitted only with their whole reservation in hand (so they never
preempt), others grow page by page; below the low watermark the reclaimer runs before the step is built."""

from __future__ import annotations

import collections
from typing import Deque, Dict, List, Optional

import numpy as np
import torch

from prio.limits import PoolLimits, Priority, Watermarks
from prio.pagepool import PagePool
from prio.reclaimer import Reclaimer
from prio.requests import Request
from prio.reservation import ReservationTable
from prio_srv.batch import DecodeBatch


class PriorityScheduler:
    def __init__(self, lim: PoolLimits, table: ReservationTable, pool: PagePool, watermarks: Watermarks,
                 reclaimer: Reclaimer, device: torch.device, high_temp: float = 0.7, base_temp: float = 1.0):
        self.lim = lim
        self.table = table
        self.pool = pool
        self.watermarks = watermarks
        self.reclaimer = reclaimer
        self.device = device
        self.high_temp = high_temp
        self.base_temp = base_temp
        self.waiting: Dict[Priority, Deque[Request]] = {p: collections.deque() for p in Priority}
        self.running: List[Request] = []
        self.prefilling: Optional[Request] = None
        self.free_slots = list(range(lim.max_rows))

    def add(self, req: Request) -> None:
        self.waiting[req.prio].append(req)

    def _pages_for(self, n_tokens: int) -> int:
        return (n_tokens + self.lim.page_size - 1) // self.lim.page_size

    def _admit(self) -> None:
        for prio in (Priority.HIGH, Priority.NORMAL, Priority.LOW):
            q = self.waiting[prio]
            while q and self.free_slots:
                req = q[0]
                need = self._pages_for(req.final_len if prio == Priority.HIGH else len(req.prompt_ids))
                spare = self.pool.num_free - (0 if prio == Priority.HIGH else self.watermarks.reserve_high)
                if need > spare:
                    break
                q.popleft()
                req.slot = self.free_slots.pop()
                self.table.reserve(req.rid, req.slot, need, prio)
                self.running.append(req)

    def schedule_step(self) -> DecodeBatch:
        if self.pool.num_free < self.watermarks.low:
            self.reclaimer.reclaim()
        self._admit()
        rows = [r for r in self.running if r.prefilled == len(r.prompt_ids)][: self.lim.max_rows]
        if self.prefilling is None:
            self.prefilling = next((r for r in self.running if r.prefilled < len(r.prompt_ids)), None)
        chunk = self.prefilling
        chunk_len = min(self.lim.chunk_tokens, len(chunk.prompt_ids) - chunk.prefilled) if chunk else 0
        n = len(rows)
        prio_np = np.array([int(r.prio) for r in rows], dtype=np.int8)
        high = np.flatnonzero(prio_np >= Priority.HIGH).tolist()  # ok: FC101
        self.num_high_rows = len(high)
        widest = max([self.table.pages[r.rid].size for r in rows], default=0)
        if widest > self.table.page_table_dev.shape[1]:
            self.table.grow_columns(widest)
        self.table.sync_rows(np.array([r.slot for r in rows], dtype=np.int64))
        if getattr(self, "prio_dev", None) is None:
            self.prio_dev = torch.zeros(self.lim.max_rows, dtype=torch.int8, device=self.device)  # ok: FC107
        self.prio_dev[:n].copy_(torch.from_numpy(prio_np), non_blocking=True)
        self.order_host = torch.empty(n, dtype=torch.int64)  # ok: FC107
        self.order_host.numpy()[:] = np.argsort(-prio_np, kind="stable")
        batch = DecodeBatch.build(rows, chunk, chunk_len, self.table.page_table_np, self.lim.page_size, self.device)
        batch.high_rows = torch.where(self.prio_dev[:n] >= Priority.HIGH)[0]  # expect: FC101
        batch.temperatures = torch.where(self.prio_dev[:n] >= Priority.HIGH, self.high_temp, self.base_temp)  # ok: FC101
        return batch
