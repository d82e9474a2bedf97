"""Step timing with CUDA events. In the default (non-blocking) mode the event pairs are
queued and the sampler thread resolves them later."""

from collections import deque

import torch
from flashcheck import hot_path


class StepTimer:
    def __init__(self, blocking: bool, depth: int = 256):
        self.blocking = blocking
        self.pending = deque(maxlen=depth)
        self.start_evt = None
        self.last_ms = 0.0

    def on_step_begin(self) -> None:
        self.start_evt = torch.cuda.Event(enable_timing=True)
        self.start_evt.record()  # ok: FC101

    @hot_path
    def on_step_end(self, step_id: int) -> None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        if self.blocking:
            end.synchronize()  # expect: FC101
            self.last_ms = self.start_evt.elapsed_time(end)
        else:
            self.pending.append((step_id, self.start_evt, end))
