"""Worker: builds the pool, the reservation table, the backend, the model and the graphs, and runs steps."""

from __future__ import annotations

import torch

from prio.limits import PoolLimits, Watermarks
from prio.pagepool import PagePool
from prio.reclaimer import Reclaimer
from prio.reservation import ReservationTable
from prio_srv.attn_backend import ReservationAttnBackend
from prio_srv.graphs import BucketGraphs
from prio_srv.model import PrioLM
from prio_srv.scheduler import PriorityScheduler


class Worker:
    def __init__(self, lim: PoolLimits, device: torch.device):
        self.lim = lim
        self.pool = PagePool(lim)
        self.table = ReservationTable(lim, self.pool, device)
        self.watermarks = Watermarks(low=lim.num_pages // 32, high=lim.num_pages // 16,
                                     reserve_high=lim.num_pages // 8)
        self.backend = ReservationAttnBackend(lim, self.table, device)
        self.model = PrioLM(lim, self.backend).to(device)
        self.reclaimer = Reclaimer(self.table, self.pool, self.watermarks, self.backend, device)
        self.scheduler = PriorityScheduler(lim, self.table, self.pool, self.watermarks, self.reclaimer, device)
        self.graphs = BucketGraphs(lim, self.backend, self.model, device)
        self.graphs.record()

    def step(self) -> torch.Tensor:
        batch = self.scheduler.schedule_step()
        bs = next((b for b in self.graphs.buckets if b >= batch.num_rows), None)
        if bs is not None and (batch.chunk_rows == 0 or batch.chunk_rows == self.lim.chunk_tokens):
            return self.graphs.run_bucket(bs, batch)
        self.backend.plan_overflow(batch)
        if batch.chunk_rows:
            self.backend.plan_chunk(batch)
        return self.model.decode_eager(batch.input_ids, batch)
