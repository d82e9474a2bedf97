from __future__ import annotations

from typing import Dict, List

import torch


class AbortMetrics:
    def __init__(self):
        self.aborted_total = 0
        self.finished_total = 0
        self.wasted_rows = 0
        self.abort_latency_s = torch.zeros(0, dtype=torch.float64)

    def on_step(self, dead_in_batch: torch.Tensor) -> None:
        self.wasted_rows += int(dead_in_batch)  # expect: FC101

    def on_reap(self, n_aborted: int, n_finished: int, latencies: List[float]) -> None:
        self.aborted_total += n_aborted
        self.finished_total += n_finished
        if latencies:
            new = torch.tensor(latencies, dtype=torch.float64)
            self.abort_latency_s = torch.cat([self.abort_latency_s, new])  # ok: FC107

    def snapshot(self) -> Dict[str, float]:
        lat = self.abort_latency_s
        return {
            "aborted_total": self.aborted_total,
            "finished_total": self.finished_total,
            "wasted_rows": self.wasted_rows,
            "abort_latency_p50_s": float(lat.median()) if lat.numel() else 0.0,
        }
