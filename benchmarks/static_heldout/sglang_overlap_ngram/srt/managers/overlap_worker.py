"""Overlap scheduling: the scheduler prepares batch N+1 while a forward thread runs batch N."""
from __future__ import annotations

import queue
import threading
from collections import deque

import torch

from ..model_executor.forward_batch_info import ForwardBatch
from ..speculative import NGRAMWorker
from .tp_worker import TpModelWorker


def resolve_future_token_ids(input_ids: torch.Tensor, future_token_ids: torch.Tensor) -> None:
    input_ids[:] = torch.where(input_ids < 0, future_token_ids[torch.clamp(-input_ids, min=0)], input_ids)  # ok: FC101


class FutureMap:
    """Next-token ids of in-flight batches; the next batch refers to them by negative ids."""

    def __init__(self, max_running_requests: int, device: torch.device) -> None:
        self.size = 5 * max_running_requests
        self.token_ids = torch.zeros(self.size + 1, dtype=torch.int64, device=device)
        self.ct = 0


class TpModelWorkerClient:
    def __init__(self, worker: TpModelWorker, ngram_worker: NGRAMWorker, server_args, device: torch.device) -> None:
        self.worker, self.ngram_worker = worker, ngram_worker
        self.future = FutureMap(server_args.max_running_requests, device)
        self.input_queue: queue.Queue = queue.Queue()
        self.output_queue: queue.Queue = queue.Queue()
        self.forward_stream = torch.cuda.Stream(device)
        self._pending: deque[int] = deque()
        self._thread = threading.Thread(target=self.forward_thread_func, daemon=True)
        self._thread.start()

    # ---- scheduler thread -------------------------------------------------------------------
    def forward_batch_generation(self, fb: ForwardBatch) -> torch.Tensor:
        """Launch a batch; returns placeholder (negative) ids for its next tokens."""
        if self.future.ct + fb.batch_size > self.future.size:
            self.future.ct = 0
        start, self.future.ct = self.future.ct, self.future.ct + fb.batch_size
        batch_ready = torch.cuda.Event()
        batch_ready.record()
        self.input_queue.put((fb, batch_ready, start))
        self._pending.append(fb.batch_size)
        return -torch.arange(start + 1, start + 1 + fb.batch_size, dtype=torch.int64)

    def resolve_last_batch_result(self):
        """Wait for the oldest in-flight batch's tokens: the one place the scheduler blocks, by design."""
        assert self._pending, "no batch in flight"  # ok: FC109
        copy_done, next_ids_cpu, accept_len_cpu = self.output_queue.get()
        copy_done.synchronize()
        self._pending.popleft()
        return next_ids_cpu.tolist(), None if accept_len_cpu is None else accept_len_cpu.tolist()  # ok: FC101

    # ---- forward thread ---------------------------------------------------------------------
    def forward_thread_func(self) -> None:
        with torch.cuda.stream(self.forward_stream):
            self.forward_thread_func_()

    @torch.no_grad()
    def forward_thread_func_(self) -> None:
        while (item := self.input_queue.get()) is not None:
            fb, batch_ready, future_start = item
            batch_ready.wait(self.forward_stream)  # ok: FC101
            resolve_future_token_ids(fb.input_ids, self.future.token_ids)
            accept_len_cpu = None
            if fb.spec_info is not None:
                next_ids, accept_len, _ = self.ngram_worker.forward_batch_speculative_generation(fb)
                self._store_future(future_start, next_ids.gather(1, accept_len[:, None]).squeeze(1))
                accept_len_cpu = accept_len.to("cpu", non_blocking=True)
            else:
                next_ids = self.worker.forward_batch_generation(fb)
                self._store_future(future_start, next_ids)
            next_ids_cpu = next_ids.to("cpu", non_blocking=True)
            if accept_len_cpu is not None:
                # feed the verified continuation back into the n-gram table
                self.ngram_worker.cache.insert(next_ids_cpu.flatten().tolist())  # expect: FC101
            copy_done = torch.cuda.Event()
            copy_done.record()
            self.output_queue.put((copy_done, next_ids_cpu, accept_len_cpu))

    def _store_future(self, start: int, ids: torch.Tensor) -> None:
        assert start + ids.numel() <= self.future.size + 1, "future slots past the ring"  # ok: FC109
        self.future.token_ids[start + 1 : start + 1 + ids.numel()] = ids
