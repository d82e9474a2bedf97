"""Every N steps: checksum a window of pages on a side stream, compare, quarantine."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from .checksum import ChecksumRecords, page_checksums
from .config import IntegrityConfig
from .quarantine import QuarantineSet


class IntegrityScanner:
    def __init__(self, cfg: IntegrityConfig, kv_cache: torch.Tensor, records: ChecksumRecords,
                 quarantine: QuarantineSet, device: torch.device, scan_every: int) -> None:
        assert scan_every > 0, "scan_every must be positive"  # expect: FC109
        self.cfg = cfg
        self.kv_cache = kv_cache
        self.records = records
        self.quarantine = quarantine
        self.device = device
        self.scan_every = scan_every
        n = cfg.pages_per_scan
        self.page_sums = torch.zeros(n, dtype=torch.int64, device=device)
        self.expected_gpu = torch.zeros(n, dtype=torch.int64, device=device)
        self.sums_host = torch.zeros(n, dtype=torch.int64, pin_memory=True)
        self.sums_np = self.sums_host.numpy()
        self.scan_done = torch.cuda.Event()
        self.stream = torch.cuda.Stream(device)
        self.cursor = 0
        self.pending: Optional[np.ndarray] = None
        self.fold_scratch: Optional[torch.Tensor] = None
        self.history_cpu = torch.zeros(0, 2, dtype=torch.int64)

    def _next_window(self) -> np.ndarray:
        valid = np.flatnonzero(self.records.valid)
        if valid.size == 0:
            return valid
        start = self.cursor % valid.size
        window = valid[start : start + self.cfg.pages_per_scan]
        self.cursor = start + window.size
        return window

    def maybe_scan(self, step: int) -> int:
        n_bad = self._drain_pending()
        if step % self.scan_every:
            return n_bad
        page_ids_np = self._next_window()
        n = int(page_ids_np.shape[0])
        if n == 0:
            return n_bad
        if self.page_sums.numel() < n:
            self.page_sums = torch.zeros(n, dtype=torch.int64, device=self.device)  # expect: FC107
        if self.fold_scratch is None:
            self.fold_scratch = torch.empty(self.cfg.pages_per_scan, dtype=torch.int64, device=self.device)  # ok: FC107
        page_ids = torch.from_numpy(page_ids_np).to(self.device, non_blocking=True)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.page_sums[:n].copy_(page_checksums(self.kv_cache, page_ids))
            if self.cfg.device_compare:
                self.expected_gpu[:n].copy_(self.records.expected_tensor(page_ids_np), non_blocking=True)
                mismatch = self.page_sums[:n] != self.expected_gpu[:n]
                if mismatch.any():  # expect: FC101
                    self.quarantine.add(page_ids[mismatch])  # expect: FC101
            else:
                self.sums_host[:n].copy_(self.page_sums[:n], non_blocking=True)  # ok: FC101
                self.pending = page_ids_np
            self.scan_done.record()
        row = torch.tensor([[step, n_bad]], dtype=torch.int64)
        self.history_cpu = torch.cat([self.history_cpu, row])  # ok: FC107
        return n_bad

    def _drain_pending(self) -> int:
        if self.pending is None or not self.scan_done.query():
            return 0
        ids = self.pending
        sums = self.sums_np[: ids.shape[0]]
        bad = ids[np.flatnonzero(sums != self.records.expected[ids])]  # ok: FC101
        self.pending = None
        self.records.invalidate(bad)
        self.quarantine.add_host(bad.tolist())  # ok: FC101
        return int(bad.shape[0])
