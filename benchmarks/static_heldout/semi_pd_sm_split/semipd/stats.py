"""Once-a-second utilisation report, on its own thread; never on the step's path."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from semipd.engine import SemiPDEngine

logger = logging.getLogger(__name__)


class StatsReporter(threading.Thread):
    def __init__(self, engine: "SemiPDEngine", period_s: float = 1.0):
        super().__init__(name="semipd-stats", daemon=True)
        self.engine = engine
        self.period_s = period_s
        self.stop_flag = threading.Event()

    def run(self) -> None:
        eng = self.engine
        while not self.stop_flag.wait(self.period_s):
            eng.stats_event.synchronize()  # ok: FC101
            rows = eng.decode.num_rows
            used = eng.pool.used_pages
            logger.info("decode rows %d, KV pages %d/%d, prefill SMs %.0f%%",
                        rows, used, eng.pool.num_pages, 100 * eng.controller.frac)
