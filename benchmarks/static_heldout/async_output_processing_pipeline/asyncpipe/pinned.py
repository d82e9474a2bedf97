"""Pinned output slots: the sampler copies into one per step, the worker reads it after its event."""

import threading
from dataclasses import dataclass, field
from typing import List

import torch

from asyncpipe.config import PipelineConfig


@dataclass
class OutputSlot:
    index: int
    tokens_pinned: torch.Tensor
    logprobs_pinned: torch.Tensor
    top_ids_pinned: torch.Tensor
    top_lp_pinned: torch.Tensor
    ready: torch.cuda.Event
    num_rows: int = 0
    request_ids: List[str] = field(default_factory=list)


class PinnedOutputRing:
    """`depth` slots; acquiring blocks the scheduler thread (not the GPU) until the worker frees one."""

    def __init__(self, cfg: PipelineConfig, depth: int):
        n, k = cfg.max_batch_size, cfg.top_logprobs
        self.slots = [
            OutputSlot(
                index=i,
                tokens_pinned=torch.empty(n, dtype=torch.int64, pin_memory=True),
                logprobs_pinned=torch.empty(n, dtype=torch.float32, pin_memory=True),
                top_ids_pinned=torch.empty(n, k, dtype=torch.int64, pin_memory=True),
                top_lp_pinned=torch.empty(n, k, dtype=torch.float32, pin_memory=True),
                ready=torch.cuda.Event(),
            )
            for i in range(depth)
        ]
        self._next = 0
        self._free = threading.Semaphore(depth)

    def acquire(self) -> OutputSlot:
        self._free.acquire()
        slot = self.slots[self._next]
        self._next = (self._next + 1) % len(self.slots)
        return slot

    def release(self, slot: OutputSlot) -> None:
        slot.num_rows = 0
        slot.request_ids = []
        self._free.release()
