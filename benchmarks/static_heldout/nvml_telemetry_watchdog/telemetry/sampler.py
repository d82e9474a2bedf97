"""The telemetry thread: one sample per period (NVML, allocator stats, resolved step times)."""

import threading
import time
from collections import deque

import torch

from telemetry.nvml import NvmlShim
from telemetry.timing import StepTimer

_WS_ATTR = "_float_workspace_buffer"


class TelemetrySampler:
    def __init__(self, nvml: NvmlShim, timer: StepTimer, device_index: int, period_s: float = 1.0):
        self.nvml = nvml
        self.timer = timer
        self.device_index = device_index
        self.period_s = period_s
        self.samples = deque(maxlen=3600)
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample_once()
            time.sleep(self.period_s)

    def _sample_once(self) -> None:
        assert self._thread is not None  # ok: FC109
        dev = self.nvml.query(self.device_index)
        rec = {
            "t": time.time(),
            "used": dev.used_bytes,
            "util": dev.util_gpu,
            "power_mw": dev.power_mw,
            "allocated": torch.cuda.memory_allocated(self.device_index),
            "reserved": torch.cuda.memory_reserved(self.device_index),
            "step_ms": [],
        }
        while self.timer.pending:
            step_id, start, end = self.timer.pending.popleft()
            end.synchronize()  # ok: FC101
            rec["step_ms"].append((step_id, start.elapsed_time(end)))
        self.samples.append(rec)

    def workspace_bytes(self, wrappers) -> int:
        total = 0
        for w in wrappers:
            buf = getattr(w, _WS_ATTR, None)  # expect: FC103
            if buf is not None:
                total += buf.numel()
        return total
