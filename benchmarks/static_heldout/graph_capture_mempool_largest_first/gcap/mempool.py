"""One graph memory pool shared by every captured bucket, with memory accounting between captures."""

from __future__ import annotations

import gc
import logging
from typing import Dict, Optional, Tuple

import torch

logger = logging.getLogger(__name__)


class GraphPoolManager:
    """Hands out the shared pool handle and measures what each capture took from the device.

    Captured largest first, the first graph sizes the pool; later (smaller) graphs reuse its blocks, so the
    per-bucket numbers after the first should be close to zero. A large number there means a capture allocated
    outside the pool (a tensor created inside the graph that outlives it).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.handle: Optional[Tuple[int, int]] = None
        self._live = 0
        self.bytes_per_capture: Dict[str, int] = {}

    def acquire(self):
        if self.handle is None:
            self.handle = torch.cuda.graph_pool_handle()
        self._live += 1
        self._check()
        return self.handle

    def release_unused(self) -> None:
        """Between captures: drop Python garbage and return cached blocks outside the pool to the driver."""
        gc.collect()
        torch.cuda.empty_cache()

    def used_bytes(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def record(self, key: str, before: int, after: int) -> None:
        self.bytes_per_capture[key] = after - before
        if len(self.bytes_per_capture) > 1 and after - before > (64 << 20):
            logger.warning("capture %s took %d MiB outside the shared pool", key, (after - before) >> 20)

    def summary(self) -> str:
        total = sum(self.bytes_per_capture.values())
        parts = ", ".join(f"{k}:{v >> 20}MiB" for k, v in self.bytes_per_capture.items())
        return f"{len(self.bytes_per_capture)} graphs, {total >> 20} MiB ({parts})"

    def _check(self) -> None:
        assert self._live >= 0 and self.handle is not None  # ok: FC109
