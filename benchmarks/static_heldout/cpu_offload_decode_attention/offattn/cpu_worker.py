"""The CPU attention thread: waits for q to land in pinned memory, attends the host pages of each row and ships
(o, lse) back to the device on its own stream."""

from __future__ import annotations

import queue
import threading
from typing import List

import torch

from offattn.cpu_attention import cpu_decode_attention
from offattn.host_pages import HostPageStore
from offattn.staging import PinnedStaging


class CPUAttentionWorker(threading.Thread):
    def __init__(self, store: HostPageStore, staging: PinnedStaging, sm_scale: float):
        super().__init__(daemon=True)
        self.store = store
        self.staging = staging
        self.sm_scale = sm_scale
        self.jobs: "queue.Queue" = queue.Queue()
        self.done: "queue.Queue" = queue.Queue()

    def submit(self, layer_id: int, num_rows: int, tables: List[List[int]], num_chunks: int = 1) -> None:
        # ``num_chunks`` splits the longest tables across the intra-op threads of the next revision
        self.num_chunks = num_chunks
        self.jobs.put((layer_id, num_rows, tables))

    def result(self) -> torch.cuda.Event:
        return self.done.get()

    def run(self) -> None:
        st = self.staging
        while True:
            layer_id, n, tables = self.jobs.get()
            st.q_ready.synchronize()  # ok: FC101
            o, lse = cpu_decode_attention(st.q_host[:n], self.store.k[layer_id], self.store.v[layer_id], tables,
                                          self.sm_scale)
            st.o_host[:n].copy_(o)
            st.lse_host[:n].copy_(lse)
            with torch.cuda.stream(st.h2d_stream):
                st.o_dev[:n].copy_(st.o_host[:n], non_blocking=True)
                st.lse_dev[:n].copy_(st.lse_host[:n], non_blocking=True)
                landed = torch.cuda.Event()
                landed.record(st.h2d_stream)
            self.done.put(landed)
