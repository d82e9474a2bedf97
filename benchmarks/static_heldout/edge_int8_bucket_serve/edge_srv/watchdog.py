"""A watchdog thread: if the step loop stops beating, wait for the GPU, reset the graph page tables and log state."""
import logging
import threading
import time
from typing import TYPE_CHECKING

from edge.runtime.attention import EdgeAttention

if TYPE_CHECKING:
    from edge_srv.server import EdgeServer

logger = logging.getLogger(__name__)


class Heartbeat:
    def __init__(self) -> None:
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def beat(self) -> None:
        with self._lock:
            self._last = time.monotonic()

    def age(self) -> float:
        with self._lock:
            return time.monotonic() - self._last


class Watchdog(threading.Thread):
    def __init__(self, server: "EdgeServer", attn: EdgeAttention, timeout_s: float):
        super().__init__(name="edge-watchdog", daemon=True)
        self.server = server
        self.attn = attn
        self.timeout_s = timeout_s
        self.stalls = 0

    def run(self) -> None:
        while True:
            time.sleep(self.timeout_s / 4)
            if self.server.heartbeat.age() > self.timeout_s:
                self._recover()

    def _recover(self) -> None:
        self.stalls += 1
        logger.error("step loop silent for %.1fs (stall #%d)", self.server.heartbeat.age(), self.stalls)
        self.server.step_done.synchronize()  # ok: FC101
        # a stalled step can leave half-written page tables: restart every bucket from the scratch page
        for buf in self.attn.indices_bufs:
            buf.zero_()  # expect: FC104
        logger.error("plan state after stall: %s", self.attn.debug_plan_state(0))
        self.server.heartbeat.beat()
