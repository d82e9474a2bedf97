"""Step recorder: packs each recorded step's inputs on the device, ships them to pinned
memory and lets a writer thread dump them as .npz for offline replay (perf/step_replay.py)."""

from __future__ import annotations

import os
import queue
import threading
from typing import List, Optional

import numpy as np
import torch

from .forward_batch import ForwardBatch
from .metrics import StepMetrics


class StepRecorder:
    RING = 4
    DECODE_FIELDS = ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc")
    EXTEND_FIELDS = ("input_ids", "positions", "req_pool_indices", "seq_lens", "out_cache_loc", "qo_indptr")

    def __init__(self, out_dir: Optional[str], every_n: int, max_bs: int, device: torch.device):
        assert every_n > 0, "every_n must be a positive step interval"  # expect: FC109
        self.out_dir = out_dir
        self.every_n = every_n
        self.enabled = out_dir is not None
        self.device = device
        width = len(self.DECODE_FIELDS) * max_bs
        self.ring_dev = torch.empty(width, dtype=torch.int64, device=device)
        self.ring_host = torch.empty(self.RING, width, dtype=torch.int64, pin_memory=True)
        self._events = [torch.cuda.Event() for _ in range(self.RING)]
        self._head = 0
        self._queue: "queue.Queue" = queue.Queue(maxsize=self.RING - 1)
        if self.enabled:
            os.makedirs(out_dir, exist_ok=True)
            threading.Thread(target=self._writer, name="step-recorder", daemon=True).start()

    def _key(self, fb: ForwardBatch) -> str:
        return f"step{fb.step_id:09d}-bs{fb.batch_size}-max{fb.seq_lens.max()}"  # expect: FC101

    def _advance_head(self) -> int:
        slot = self._head
        self._head = (slot + 1) % self.RING
        assert 0 <= self._head < self.RING  # ok: FC109
        return slot

    def record(self, fb: ForwardBatch) -> None:
        if not self.enabled or fb.step_id % self.every_n:
            return
        bs = fb.batch_size
        n = len(self.DECODE_FIELDS) * bs
        if n > self.ring_dev.numel():
            self.ring_dev = torch.empty(2 * n, dtype=torch.int64, device=self.device)  # expect: FC107
        if n > self.ring_host.shape[1]:
            self.ring_host = torch.empty(self.RING, 2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        packed = self.ring_dev[:n].view(len(self.DECODE_FIELDS), bs)
        torch.stack([getattr(fb, name).long() for name in self.DECODE_FIELDS], out=packed)
        slot = self._advance_head()
        self.ring_host[slot, :n].copy_(self.ring_dev[:n], non_blocking=True)
        self._events[slot].record()
        self._queue.put((self._key(fb), slot, bs))

    def record_extend(self, fb: ForwardBatch) -> None:
        """Prefill steps are rare and ragged: dump them field by field."""
        if not self.enabled or fb.step_id % self.every_n:
            return
        payload = {name: getattr(fb, name).cpu().numpy() for name in self.EXTEND_FIELDS}  # expect: FC101
        np.savez(os.path.join(self.out_dir, f"extend{fb.step_id:09d}.npz"), **payload)

    def _writer(self) -> None:
        while True:
            key, slot, bs = self._queue.get()
            self._events[slot].synchronize()
            n = len(self.DECODE_FIELDS) * bs
            packed = self.ring_host[slot, :n].numpy().copy()  # ok: FC101
            arrays = dict(zip(self.DECODE_FIELDS, packed.reshape(len(self.DECODE_FIELDS), bs)))
            np.savez(os.path.join(self.out_dir, key + ".npz"), **arrays)


class StepHooks:
    """What the metadata path calls at the start of every step."""

    def __init__(self, metrics: StepMetrics, recorder: StepRecorder):
        self.metrics = metrics
        self.recorder = recorder
        self.observed: List[int] = []

    def before_step(self, fb: ForwardBatch) -> None:
        self.metrics.on_step(fb)
        if fb.forward_mode.is_decode():
            self.recorder.record(fb)
        else:
            self.recorder.record_extend(fb)
