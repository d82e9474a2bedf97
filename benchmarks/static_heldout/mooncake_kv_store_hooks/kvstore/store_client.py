"""Put and get of KV pages by key through the transfer engine, staged in registered pinned memory."""

from __future__ import annotations

import logging
from typing import List, Sequence, Tuple

import torch

from kvstore.config import StoreConfig
from kvstore.transfer_engine import TransferEngine

logger = logging.getLogger(__name__)


class MooncakeStoreClient:
    def __init__(self, cfg: StoreConfig, transfer: TransferEngine, page_bytes: int) -> None:
        self.cfg = cfg
        self.transfer = transfer
        self.page_bytes = page_bytes
        self.max_inflight = cfg.max_inflight_puts
        # one registered region: the first half receives gets, the second half stages puts
        self.get_region = torch.empty(cfg.max_load_pages, page_bytes, dtype=torch.uint8, pin_memory=True)
        self.put_region = torch.empty(cfg.max_inflight_puts, page_bytes, dtype=torch.uint8, pin_memory=True)
        transfer.register(self.get_region)
        transfer.register(self.put_region)
        self._pending_puts: List[Tuple[List[str], torch.Tensor]] = []

    def get_pages(self, keys: Sequence[str]) -> torch.Tensor:
        n = len(keys)
        if n > self.get_region.shape[0]:
            raise ValueError(f"{n} pages exceed the registered get region of {self.get_region.shape[0]}")
        base = self.get_region.data_ptr()
        rc = self.transfer.batch_read(keys, [base + i * self.page_bytes for i in range(n)], [self.page_bytes] * n)
        bad = [k for k, r in zip(keys, rc) if r < 0]
        if bad:
            raise IOError(f"{len(bad)} of {n} pages vanished from the store between exists and get: {bad[:3]}")
        return self.get_region[:n]

    def put_pages(self, keys: List[str], pages: torch.Tensor) -> None:
        assert len(keys) == pages.shape[0], "one key per page"  # expect: FC109
        self._pending_puts.append((keys, pages))
        if sum(len(k) for k, _ in self._pending_puts) >= self.max_inflight:
            self.flush()

    def flush(self) -> None:
        self._flush(self._pending_puts)
        self._pending_puts = []

    def _flush(self, pending: List[Tuple[List[str], torch.Tensor]]) -> None:
        assert sum(len(k) for k, _ in pending) <= 2 * self.max_inflight  # ok: FC109
        for keys, pages in pending:
            n = len(keys)
            self.put_region[:n].copy_(pages.view(n, -1))
            base = self.put_region.data_ptr()
            rc = self.transfer.batch_write(keys, [base + i * self.page_bytes for i in range(n)], [self.page_bytes] * n)
            failed = sum(1 for r in rc if r < 0)
            if failed:
                logger.warning("store put: %d of %d pages failed (store full?)", failed, n)
