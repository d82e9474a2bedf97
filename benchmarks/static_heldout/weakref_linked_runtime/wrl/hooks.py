"""Step-end hooks, registered as ``weakref.WeakMethod``s.

Observers (metrics, stop checking, KV usage for admission control) register bound methods; the
registry never keeps an observer alive, and a collected observer's hook disappears by itself.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from typing import Callable

import torch

from wrl.batch import ScheduleBatch, StepOutput
from wrl.buffers import GraphBufferPool

logger = logging.getLogger(__name__)


class StepHookRegistry:
    def __init__(self, name: str):
        self.name = name
        self._hooks: list[weakref.WeakMethod] = []

    def register(self, method: Callable[[ScheduleBatch, StepOutput], None]) -> None:
        assert inspect.ismethod(method), f"{self.name}: hooks must be bound methods"  # expect: FC109
        self._hooks.append(weakref.WeakMethod(method, self._forget))

    def _forget(self, ref: weakref.WeakMethod) -> None:
        try:
            self._hooks.remove(ref)
        except ValueError:
            pass

    def fire(self, batch: ScheduleBatch, out: StepOutput) -> None:
        for ref in list(self._hooks):
            hook = ref()
            if hook is not None:
                hook(batch, out)

    def __len__(self) -> int:
        return len(self._hooks)


class MetricsCollector:
    def __init__(self):
        self.steps = 0
        self.tokens = 0
        self.max_seq_len_seen = 0
        self.final_lengths: list[int] = []

    def on_step_end(self, batch: ScheduleBatch, out: StepOutput) -> None:
        self.steps += 1
        self.tokens += batch.batch_size
        self.max_seq_len_seen = max(self.max_seq_len_seen, out.seq_lens.max().item())  # expect: FC101

    def on_shutdown(self, batch: ScheduleBatch, out: StepOutput) -> None:
        # last batch of the engine's life: keep its lengths for the run report
        self.final_lengths = out.seq_lens.cpu().tolist()  # ok: FC101


class StopChecker:
    """Finishes requests that sampled EOS."""

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id
        self.pending_finished: list[torch.Tensor] = []

    def on_step_end(self, batch: ScheduleBatch, out: StepOutput) -> None:
        rows = torch.arange(batch.batch_size, device=out.next_token_ids.device)
        finished_rows = rows[out.next_token_ids == self.eos_token_id]  # expect: FC101
        if finished_rows.numel():
            self.pending_finished.append(finished_rows)


class LengthChecker:
    """Finishes requests that reached their length limit; the lengths are the scheduler's own."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.finished_rids: list[int] = []

    def on_step_end(self, batch: ScheduleBatch, out: StepOutput) -> None:
        over = batch.rids_np[batch.seq_lens_np >= self.max_len]  # ok: FC101
        self.finished_rids.extend(over.tolist())


class KVUsageReporter:
    """Pages in use per request, for the scheduler's admission control."""

    def __init__(self, page_size: int, graph_buffers: GraphBufferPool):
        self.page_size = page_size
        self._bufs_ref = weakref.ref(graph_buffers)
        self.pages_per_request: list[int] = []

    def on_step_end(self, batch: ScheduleBatch, out: StepOutput) -> None:
        bufs = self._bufs_ref()
        if bufs is None:
            return
        bs = batch.batch_size
        pages = (out.seq_lens + self.page_size - 1) // self.page_size
        # reuse the graph's indptr as scratch rather than allocating every step
        bufs.kv_indptr[1 : bs + 1].copy_(torch.cumsum(pages, 0, dtype=torch.int32))  # expect: FC104
        self.pages_per_request = torch.diff(bufs.kv_indptr[: bs + 1]).tolist()  # expect: FC101
