"""Async scheduler: admits requests, builds page tables off the event loop and streams batches."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Optional

import numpy as np
import torch

from aiostep import EngineConfig, Request, ScheduledBatch


class AsyncScheduler:
    def __init__(self, cfg: EngineConfig, device: torch.device, max_running: int, indices_sink=None):
        assert 0 < max_running <= cfg.max_batch, "max_running must fit the batch limit"  # expect: FC109
        self.cfg, self.device, self.max_running = cfg, device, max_running
        self.indices_sink: Optional[torch.Tensor] = indices_sink  # replay's copy then finds the indices in place
        self.waiting: asyncio.Queue[Request] = asyncio.Queue()
        self.running: list[Request] = []
        self.finished = torch.zeros(cfg.max_batch, dtype=torch.bool, device=device)
        self.slots: Optional[torch.Tensor] = None
        self.pages_in_use = 0

    def _admit(self) -> None:
        while not self.waiting.empty() and len(self.running) < self.max_running:
            self.running.append(self.waiting.get_nowait())
        assert len(self.running) <= self.max_running  # ok: FC109

    def build_host_page_table(self, reqs: list[Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Runs on a worker thread through asyncio.to_thread: numpy only, nothing touches the GPU."""
        page = self.cfg.page_size
        lens = np.array([r.seq_len for r in reqs], dtype=np.int32)
        pages = (lens + page - 1) // page
        indptr = np.zeros(len(reqs) + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        total = int(indptr[-1])  # ok: FC101
        chunks = [np.asarray(r.pages[:n], dtype=np.int32) for r, n in zip(reqs, pages)]  # ok: FC101
        indices = np.concatenate(chunks) if chunks else np.zeros(total, dtype=np.int32)
        return indptr, indices, (lens - (pages - 1) * page).astype(np.int32)

    async def stream_batches(self) -> AsyncIterator[ScheduledBatch]:
        while True:
            self._admit()
            if not self.running:
                await asyncio.sleep(0.001)
                continue
            done_slots = self.finished.nonzero().flatten().tolist()  # expect: FC101
            if done_slots:
                self.finished[done_slots] = False
                self.running = [r for r in self.running if r.slot not in set(done_slots)]
                continue
            reqs = list(self.running)
            indptr_np, indices_np, last_np = await asyncio.to_thread(self.build_host_page_table, reqs)
            yield self._upload(reqs, torch.from_numpy(indptr_np), torch.from_numpy(indices_np), torch.from_numpy(last_np))

    def _upload(self, reqs: list[Request], kv_indptr_cpu, indices_cpu, last_cpu) -> ScheduledBatch:
        n, dev = len(reqs), self.device
        if self.slots is None or self.slots.numel() < n:
            self.slots = torch.empty(self.cfg.max_batch, dtype=torch.int64, device=dev)  # expect: FC107
        self.slots[:n].copy_(torch.tensor([r.slot for r in reqs]), non_blocking=True)
        seq_lens_cpu = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        qo_indptr_cpu = torch.arange(n + 1, dtype=torch.int32)
        kv_indices = indices_cpu.to(dev, non_blocking=True)
        if self.indices_sink is not None:
            self.indices_sink[: kv_indices.numel()].copy_(kv_indices, non_blocking=True)  # expect: FC104
        return ScheduledBatch(
            input_ids=torch.tensor([r.last_token for r in reqs]).to(dev, non_blocking=True),
            positions=(seq_lens_cpu.long() - 1).to(dev, non_blocking=True),
            slot_ids=self.slots[:n], seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            kv_indptr=kv_indptr_cpu.to(dev, non_blocking=True), kv_indices=kv_indices,
            kv_last_page_len=last_cpu.to(dev, non_blocking=True), qo_indptr=qo_indptr_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu, kv_indptr_cpu=kv_indptr_cpu, kv_last_page_len_cpu=last_cpu,
            qo_indptr_cpu=qo_indptr_cpu, req_ids=tuple(r.rid for r in reqs),
        )
