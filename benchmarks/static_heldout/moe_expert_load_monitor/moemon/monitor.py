"""The monitoring thread: waits for each snapshot, keeps a window, proposes a new placement."""
from __future__ import annotations

import queue
import threading
from typing import Optional

import numpy as np
import torch

from .constants import IMBALANCE_THRESHOLD


def propose_placement(load_np: np.ndarray, ep_size: int) -> np.ndarray:
    """Snake-order the experts of each layer by load over the EP ranks; returns logical -> physical slot."""
    num_layers, num_experts = load_np.shape
    per_rank = num_experts // ep_size
    out = np.empty_like(load_np, dtype=np.int64)
    for layer in range(num_layers):
        order = np.argsort(-load_np[layer], kind="stable")
        fill = np.zeros(ep_size, dtype=np.int64)
        for i, expert in enumerate(order):
            rnd, pos = divmod(i, ep_size)
            rank = pos if rnd % 2 == 0 else ep_size - 1 - pos
            out[layer, expert] = rank * per_rank + fill[rank]
            fill[rank] += 1
    return out


class LoadMonitor:
    def __init__(self, num_layers: int, num_experts: int, ep_size: int, window: int = 8):
        self.ep_size = ep_size
        self.window_np = np.zeros((window, num_layers, num_experts), dtype=np.int64)
        self.filled = 0
        self._queue: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._proposal: Optional[np.ndarray] = None
        self._thread = threading.Thread(target=self._run, name="moe-load-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, step: int, host_counts: torch.Tensor, ready: torch.cuda.Event) -> None:
        self._queue.put((step, host_counts, ready))

    def poll_proposal(self) -> Optional[np.ndarray]:
        with self._lock:
            proposal, self._proposal = self._proposal, None
        return proposal

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            _step, host_counts, ready = item
            ready.synchronize()  # ok: FC101
            counts_np = host_counts.numpy().copy()
            self.window_np[self.filled % len(self.window_np)] = counts_np
            self.filled += 1
            if self._imbalance() > IMBALANCE_THRESHOLD:
                proposal = propose_placement(self.window_np.sum(axis=0), self.ep_size)
                with self._lock:
                    self._proposal = proposal

    def _imbalance(self) -> float:
        assert self.window_np.ndim == 3, "window must be (steps, layers, experts)"  # ok: FC109
        load = self.window_np.sum(axis=0)
        return float((load.max(axis=1) / (load.mean(axis=1) + 1e-6)).max())

    def stop(self) -> None:
        self._queue.put(None)
