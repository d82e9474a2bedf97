"""Fills the idle buffer set with the next step's page tables.

While slot ``s`` replays, the engine hands the next step's page tables to
``stage_next(s ^ 1, ...)``: the pinned mirrors of the other set are filled with
numpy and the indices are pushed to the device on a side stream, so that the
next step's replay preparation only has to plan.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence

import numpy as np
import torch

from dbuf.buffers import BufferSet
from dbuf.config import DoubleBufferConfig


@dataclasses.dataclass
class StagedTables:
    slot: int
    batch_size: int
    nnz: int
    widest: int


class PageTableStager:
    def __init__(self, cfg: DoubleBufferConfig, buffer_sets: List[BufferSet], device: torch.device):
        self.cfg = cfg
        self.sets = buffer_sets
        self.device = device
        self.copy_stream = torch.cuda.Stream(device=device)
        # request -> page table on the device, read by the KV-append kernel
        self.req_to_page = torch.zeros(cfg.max_batch, 64, dtype=torch.int32, device=device)
        # flat staging area for the concatenated page tables
        self.staging_host = torch.empty(cfg.max_batch * 64, dtype=torch.int32, pin_memory=True)
        # what was staged into each slot, for the engine's bookkeeping
        self._plan_info: Dict[int, StagedTables] = {}

    def stage_next(
        self, slot: int, page_tables: Sequence[np.ndarray], seq_lens_np: np.ndarray
    ) -> StagedTables:
        assert len(page_tables) <= self.cfg.max_batch  # expect: FC109
        bufs = self.sets[slot]
        # The set is free again once the replay that last read it has finished.
        bufs.consumed.synchronize()  # expect: FC101

        bs = len(page_tables)
        counts = np.fromiter((len(t) for t in page_tables), dtype=np.int32, count=bs)
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        nnz = int(indptr[-1])
        if nnz > self.staging_host.numel():
            self.staging_host = torch.empty(nnz * 2, dtype=torch.int32, pin_memory=True)  # ok: FC107
        flat = np.concatenate(page_tables).astype(np.int32) if bs else np.zeros(0, np.int32)
        self.staging_host[:nnz].copy_(torch.from_numpy(flat))

        last = ((seq_lens_np - 1) % self.cfg.page_size + 1).astype(np.int32)
        bufs.indptr_host[: bs + 1].copy_(torch.from_numpy(indptr))
        bufs.indices_host[:nnz].copy_(self.staging_host[:nnz])  # ok: FC104
        bufs.last_len_host[:bs].copy_(torch.from_numpy(last))

        widest = int(counts.max()) if bs else 0
        if widest > self.req_to_page.shape[1]:
            self.req_to_page = torch.zeros(self.cfg.max_batch, widest * 2, dtype=torch.int32, device=self.device)  # expect: FC107
        padded = np.zeros((bs, self.req_to_page.shape[1]), dtype=np.int32)
        for row, table in enumerate(page_tables):
            padded[row, : len(table)] = table

        with torch.cuda.stream(self.copy_stream):
            bufs.indices[:nnz].copy_(bufs.indices_host[:nnz], non_blocking=True)  # expect: FC104
            self.req_to_page[:bs].copy_(torch.from_numpy(padded), non_blocking=True)
            bufs.ready.record(self.copy_stream)

        bufs.nnz, bufs.batch_size = nnz, bs
        staged = StagedTables(slot=slot, batch_size=bs, nnz=nnz, widest=widest)
        self._plan_info[slot] = staged  # ok: FC103
        return staged

    def staged(self, slot: int) -> StagedTables:
        return self._plan_info[slot]
