"""Admission counters kept on the GPU and a pinned host mirror the host reads one step late."""

from __future__ import annotations

import dataclasses
import logging

import torch

logger = logging.getLogger(__name__)

WAITING, ADMITTED, FINISHED, FREE_PAGES = 0, 1, 2, 3
NUM_COUNTS = 4


@dataclasses.dataclass
class AdmissionCounters:
    """Scalars that the admission and release kernels update in place (views of ``packed``)."""

    waiting: torch.Tensor
    admitted: torch.Tensor
    finished: torch.Tensor
    packed: torch.Tensor

    @classmethod
    def allocate(cls, device: torch.device) -> "AdmissionCounters":
        packed = torch.zeros(NUM_COUNTS, dtype=torch.int64, device=device)
        return cls(
            waiting=packed[WAITING],
            admitted=packed[ADMITTED],
            finished=packed[FINISHED],
            packed=packed,
        )

    def record_push(self, n: int) -> None:
        self.waiting.add_(n)

    def record_admission(self, n_admit: torch.Tensor) -> None:
        self.admitted.add_(n_admit)
        self.waiting.sub_(n_admit)

    def record_finish(self, n_done: torch.Tensor) -> None:
        self.finished.add_(n_done)


class CountMirror:
    """Pinned copy of ``AdmissionCounters.packed``.

    ``publish`` issues a non-blocking copy at the end of a step and records ``ready``; the output
    thread waits on ``ready`` before it releases the step's tokens, and the next step is only
    started after that, so ``counts_pinned`` has landed when ``schedule_step`` reads it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.counts_pinned = torch.zeros(NUM_COUNTS, dtype=torch.int64, pin_memory=True)
        self.counts_np = self.counts_pinned.numpy()
        self.ready = torch.cuda.Event()

    def publish(self, counters: AdmissionCounters, free_top: torch.Tensor) -> None:
        assert self.counts_pinned.is_pinned(), "mirror must stay page-locked for async copies"  # ok: FC109
        counters.packed[FREE_PAGES].copy_(free_top)
        self.counts_pinned.copy_(counters.packed, non_blocking=True)
        self.ready.record()

    def wait_landed(self) -> None:
        # only ever called from the output thread
        self.ready.synchronize()  # ok: FC101
