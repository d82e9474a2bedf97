"""Flags transfers that stopped making progress."""

from __future__ import annotations

import logging
import time
from typing import List

from kvx import TransferConfig
from kx_decode.backend import DecodeAttnBackend
from kx_decode.receiver import DecodeReceiver

logger = logging.getLogger(__name__)


class TransferWatchdog:
    def __init__(self, cfg: TransferConfig, receiver: DecodeReceiver, backend: DecodeAttnBackend):
        self.cfg = cfg
        self.receiver = receiver
        self.backend = backend
        self.last_received = 0
        self.last_progress = time.monotonic()

    def check(self) -> List[int]:
        now = time.monotonic()
        received = int(self.receiver.bytes_received.sum())  # expect: FC101
        announced = float(self.receiver.bytes_announced_host[0])  # ok: FC101
        if received != self.last_received:
            self.last_received = received
            self.last_progress = now
        stuck = [s for s, t0 in self.receiver.inflight_since.items() if now - t0 > self.cfg.transfer_timeout_s]
        if stuck and announced > received:
            info = getattr(self.backend.eager_decode, "_plan_info", None)  # expect: FC103
            logger.warning("%d transfers stuck: %d of %d bytes landed, idle %.1fs (last eager plan %s)",
                           len(stuck), received, int(announced), now - self.last_progress, info)
        return stuck
