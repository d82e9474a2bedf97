"""The serving loop: host copies of the sampled ids happen here, off the scheduler."""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .scheduler import JumpForwardScheduler, StepHandle


def serve_forever(sched: JumpForwardScheduler) -> None:
    pinned = torch.empty(sched.cfg.max_batch_size, dtype=torch.int64, pin_memory=True)
    done = torch.cuda.Event()
    prev: Optional[StepHandle] = None
    prev_np: Optional[np.ndarray] = None
    while sched.running or sched.waiting:
        handle = sched.schedule_step(prev, prev_np)
        if handle is None:
            break
        n = len(handle.rids)
        pinned[:n].copy_(handle.next_ids, non_blocking=True)
        done.record()
        done.synchronize()
        prev_np = pinned[:n].numpy().copy()
        sched.finish_step(handle, prev_np)
        prev = handle
