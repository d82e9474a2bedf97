"""Moves SMs between the partitions when the prefill latency drifts from its target."""

from __future__ import annotations

import collections
import logging
from typing import TYPE_CHECKING, Deque, Optional

if TYPE_CHECKING:
    from semipd.engine import SemiPDEngine

logger = logging.getLogger(__name__)


class SMController:
    def __init__(self, engine: "SemiPDEngine"):
        self.engine = engine
        self.cfg = engine.cfg
        self.frac = engine.cfg.prefill_sm_frac
        self.window: Deque[float] = collections.deque(maxlen=32)
        # FA2 decode kernels tolerate small partitions; trtllm-gen wants whole GPCs
        self.min_decode_frac = 0.2 if engine.decode._backend == "fa2" else 0.35  # ok: FC103
        self.pending: Optional[float] = None

    def observe(self, prefill_ms: float) -> None:
        self.window.append(prefill_ms)
        if len(self.window) < self.window.maxlen:
            return
        mean = sum(self.window) / len(self.window)
        target = self.cfg.prefill_latency_target_ms
        if mean > 1.15 * target and self.frac < 1.0 - self.min_decode_frac:
            self.pending = min(1.0 - self.min_decode_frac, self.frac + 0.05)
        elif mean < 0.7 * target and self.frac > 0.3:
            self.pending = max(0.3, self.frac - 0.05)

    def apply_pending(self) -> bool:
        """Called between steps by the server loop; re-partitions and re-captures the decode graphs."""
        if self.pending is None:
            return False
        self.frac, self.pending = self.pending, None
        self.engine.repartition(self.frac)
        self.window.clear()
        logger.info("prefill partition now %.0f%% of SMs", 100 * self.frac)
        return True
