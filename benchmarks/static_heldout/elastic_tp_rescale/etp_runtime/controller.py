"""Background controller that decides when to rescale between TP=2 and TP=4."""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from etp_runtime.engine import ElasticEngine


class RescaleController:
    def __init__(self, engine: "ElasticEngine", low_tps: float, high_tps: float, interval_s: float = 2.0) -> None:
        self.engine = engine
        self.low_tps = low_tps
        self.high_tps = high_tps
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._requested: Optional[int] = None
        self._ack = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_tokens = 0

    def pending(self) -> Optional[int]:
        with self._lock:
            return self._requested

    def acknowledge(self) -> None:
        self._ack.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="tp-rescale", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            time.sleep(self.interval_s)
            tokens = self.engine.decoded_tokens_dev.item()  # ok: FC101
            rate = (tokens - self._last_tokens) / self.interval_s
            self._last_tokens = tokens
            tp = int(self.engine.tp_cpu[0])
            target = tp
            if rate > self.high_tps and tp == 2:
                target = 4
            elif rate < self.low_tps and tp == 4:
                target = 2
            if target == tp:
                continue
            with self._lock:
                self._requested = target
            # the step loop acknowledges at its next step boundary and idles
            self._ack.wait(timeout=10.0)
            self.engine.rescale(target)
            with self._lock:
                self._requested = None
            self._ack.clear()
