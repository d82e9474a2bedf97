"""Step latency from CUDA events; elapsed times are read once the end event has completed."""

from collections import deque
from typing import Deque, List, Optional

import torch
from flashcheck import hot_path


class StepTimer:
    def __init__(self, depth: int = 128):
        self.depth = depth
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(depth)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(depth)]
        self.pending: Deque[int] = deque()
        self.slot = 0
        self.latency_hist = torch.zeros(0, dtype=torch.float32)

    def start(self) -> int:
        i = self.slot
        self.slot = (i + 1) % self.depth
        self.starts[i].record()
        return i

    @hot_path
    def stop(self, i: int, wait: bool = False) -> Optional[float]:
        self.ends[i].record()
        if wait:
            self.ends[i].synchronize()  # expect: FC101
            return self.starts[i].elapsed_time(self.ends[i])
        self.pending.append(i)
        return None

    def collect(self) -> List[float]:
        done: List[float] = []
        while self.pending and self.ends[self.pending[0]].query():
            i = self.pending.popleft()
            done.append(self.starts[i].elapsed_time(self.ends[i]))  # ok: FC101
        if done:
            self.latency_hist = torch.cat([self.latency_hist, torch.tensor(done)])[-4096:]  # ok: FC107
        return done
