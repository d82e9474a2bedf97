"""Mirrors the primary's dirty KV pages and page tables into the standby on a side stream."""

import numpy as np
import torch

from rep_attn.backend import ReplicaBackend
from standby.pages import PagePool


class ReplicaSyncManager:
    def __init__(
        self,
        primary_pool: PagePool,
        standby_pool: PagePool,
        primary_backend: ReplicaBackend,
        standby_backend: ReplicaBackend,
        every: int,
        full_every: int,
    ):
        assert every > 0 and full_every > 0, "sync intervals must be positive"  # expect: FC109
        if primary_pool._kv_layout != standby_pool._kv_layout:  # ok: FC103
            raise ValueError("primary and standby pools use different KV layouts")
        self.primary_pool = primary_pool
        self.standby_pool = standby_pool
        self.primary_backend = primary_backend
        self.standby_backend = standby_backend
        self.every = every
        self.full_every = full_every
        self.device = standby_pool.device
        self.copy_stream = torch.cuda.Stream(device=primary_pool.device)
        self.copy_done = torch.cuda.Event()
        self.lag_history_cpu = torch.zeros(0, dtype=torch.int64)
        self.last_synced_step = 0

    def _check_streams(self) -> None:
        assert self.copy_stream is not None and self.copy_done is not None, "sync manager not started"  # ok: FC109

    def maybe_sync(self, step: int) -> None:
        if step % self.every:
            return
        self._check_streams()
        # the staging of the previous mirror must have landed before we reuse it
        self.copy_done.synchronize()  # expect: FC101
        if step % (self.every * self.full_every) == 0:
            # full sweep: the append kernel marks pages only in the device mask
            dirty = torch.nonzero(self.primary_pool.dirty_mask).flatten()  # expect: FC101
        else:
            pages = np.flatnonzero(self.primary_pool.dirty_np)  # ok: FC101
            dirty = torch.from_numpy(pages).to(self.primary_pool.device, non_blocking=True)
        rows = self.primary_backend.last_rows
        cols = self.primary_backend.max_pages_in_batch
        n_idx = self.primary_backend.last_num_indices
        with torch.cuda.stream(self.copy_stream):
            self.primary_pool.copy_pages_to(self.standby_pool, dirty, dirty.to(self.device, non_blocking=True))
            self.standby_pool.page_table[:rows, :cols].copy_(self.primary_pool.page_table[:rows, :cols], non_blocking=True)  # ok: FC104
            # so that a failover can replay the standby's bucket right away
            self.standby_backend.kv_indices_buf[:n_idx].copy_(self.primary_backend.kv_indices_buf[:n_idx], non_blocking=True)  # expect: FC104
            self.copy_done.record(self.copy_stream)
        self.primary_pool.clear_dirty()
        lag = torch.tensor([step - self.last_synced_step], dtype=torch.int64)
        self.lag_history_cpu = torch.cat([self.lag_history_cpu, lag])  # ok: FC107
        self.last_synced_step = step
