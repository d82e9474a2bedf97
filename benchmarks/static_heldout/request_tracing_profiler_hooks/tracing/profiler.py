"""Records kernel timings with CUDA events every N steps."""
from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator, List, Sequence, Tuple

import numpy as np
import torch

import flashcheck


class SamplingProfiler:
    def __init__(self, every_n: int, kernels: Sequence[str], device: torch.device):
        self.every_n = every_n
        self.kernels = list(kernels)
        self.device = device
        self.events: Dict[str, Tuple[torch.cuda.Event, torch.cuda.Event]] = {
            k: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for k in self.kernels
        }
        self.start_event = torch.cuda.Event(enable_timing=True)
        self.end_event = torch.cuda.Event(enable_timing=True)
        self.wall_ms_np = np.zeros(4096, dtype=np.float64)
        self.n = 0
        self.t0 = 0.0
        self.sampled = False
        self.timings_host = torch.zeros(len(self.kernels), dtype=torch.float32, pin_memory=True)
        self.history: List[Tuple[int, float, float]] = []
        self._plan_info: Dict[int, object] = {}  # ok: FC103

    def begin(self, step_idx: int) -> None:
        self.sampled = step_idx % self.every_n == 0
        if self.sampled:
            self.t0 = time.perf_counter()
            self.start_event.record()

    @contextlib.contextmanager
    def kernel(self, name: str) -> Iterator[None]:
        if not self.sampled:
            yield
            return
        start, end = self.events[name]
        start.record()
        yield
        end.record()

    def record_plan(self, w, bs: int) -> None:
        if self.sampled:
            self._plan_info[bs] = getattr(w, "_plan_info", None)  # expect: FC103

    @flashcheck.hot_path
    def on_step(self, step_idx: int) -> None:
        if not self.sampled:
            return
        self.end_event.record()
        self.end_event.synchronize()  # expect: FC101
        step_ms = self.start_event.elapsed_time(self.end_event)
        self.timings_host = torch.zeros(len(self.kernels), dtype=torch.float32, pin_memory=True)  # ok: FC107
        for i, k in enumerate(self.kernels):
            start, end = self.events[k]
            self.timings_host[i] = start.elapsed_time(end)
        self.wall_ms_np[self.n % len(self.wall_ms_np)] = (time.perf_counter() - self.t0) * 1e3
        self.n += 1
        avg = float(self.wall_ms_np[: min(self.n, len(self.wall_ms_np))].mean())  # ok: FC101
        self.history.append((step_idx, step_ms, avg))

    def report(self) -> dict:
        return {"kernels": dict(zip(self.kernels, self.timings_host.tolist())), "steps": self.history[-16:]}  # ok: FC101
