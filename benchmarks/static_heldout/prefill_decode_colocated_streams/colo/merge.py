"""Host bookkeeping: first tokens from prefill, next tokens from decode, merged per request."""
from __future__ import annotations

import queue
import threading
from collections import defaultdict
from typing import Dict, List, Sequence

import torch


class OutputMerger:
    def __init__(self) -> None:
        self.outputs: Dict[int, List[int]] = defaultdict(list)
        self.rid_table_cpu = torch.empty(64, dtype=torch.int64)
        self.inflight = 0
        self._queue: "queue.Queue" = queue.Queue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.drain, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add_first_tokens(self, rids: Sequence[int], tokens: Sequence[int]) -> None:
        with self._lock:
            for rid, tok in zip(rids, tokens):
                self.outputs[rid].append(tok)

    def submit(self, tokens_host: torch.Tensor, n: int, done: torch.cuda.Event, rids: Sequence[int]) -> None:
        """Hand a decode step's pinned tokens to the drain thread; nothing here waits on the GPU."""
        if self.rid_table_cpu.numel() < n:
            self.rid_table_cpu = torch.empty(2 * n, dtype=torch.int64)  # ok: FC107
        self.rid_table_cpu[:n] = torch.tensor(list(rids), dtype=torch.int64)
        self.inflight += 1
        self._queue.put((tokens_host, n, done, self.rid_table_cpu[:n].clone()))

    def drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            tokens_host, n, done, rids_cpu = item
            done.synchronize()
            tokens = tokens_host[:n].tolist()  # ok: FC101
            with self._lock:
                for rid, tok in zip(rids_cpu.tolist(), tokens):
                    self.outputs[rid].append(tok)
                self.inflight -= 1
                self._check()

    def _check(self) -> None:
        assert self.inflight >= 0, "merger accounting underflow"  # ok: FC109

    def stop(self) -> None:
        self._queue.put(None)
