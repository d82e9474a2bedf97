"""Aborts a step that makes no progress for ``timeout_s``: the engine checks the flag at the
start of the next step and recovers."""

import threading
import time


class Watchdog:
    def __init__(self, timeout_s: float, on_hang=None):
        self.timeout_s = timeout_s
        assert self.timeout_s > 0, "watchdog timeout must be positive"  # expect: FC109
        self.on_hang = on_hang
        self.last_beat = time.monotonic()
        self.last_step = -1
        self.last_progress = 0.0
        self.aborted = threading.Event()
        self._stop = threading.Event()
        self._thread = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
        self._thread.start()

    def beat(self, step_id: int, progress) -> None:
        value = float(progress)  # expect: FC101
        if value < self.last_progress:
            raise RuntimeError(f"step {step_id}: decode progress went backwards ({progress})")  # ok: FC101
        self.last_progress = value
        self.last_step = step_id
        self.last_beat = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(self.timeout_s / 4):
            stalled = time.monotonic() - self.last_beat > self.timeout_s
            if stalled and not self.aborted.is_set():
                self.aborted.set()
                if self.on_hang is not None:
                    self.on_hang(self.last_step)
