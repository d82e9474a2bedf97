"""Worker threads that run the host half of each layer's attention."""

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch

from hybridattn import HybridConfig, attend_far_chunked


@dataclass
class FarJob:
    layer: int
    q_host: torch.Tensor           # pinned [bs, H, D], filled by a non_blocking copy
    ready: torch.cuda.Event        # recorded on the compute stream after that copy
    rows_np: np.ndarray            # batch rows that have host tokens
    far_lens_np: np.ndarray
    far_pages: List[np.ndarray]


class CpuAttentionPool:
    def __init__(self, cfg: HybridConfig, k_host: torch.Tensor, v_host: torch.Tensor):
        self.cfg = cfg
        self.k_host = k_host               # [layers, host_pages, page, kv_heads, dim], pinned
        self.v_host = v_host
        self.scale = cfg.head_dim ** -0.5
        self.jobs: "queue.Queue" = queue.Queue()
        self.o_host = torch.zeros((cfg.max_batch, cfg.num_qo_heads, cfg.head_dim), dtype=torch.float32,
                                  pin_memory=True)
        self.lse_host = torch.zeros((cfg.max_batch, cfg.num_qo_heads), dtype=torch.float32, pin_memory=True)
        self.threads = [threading.Thread(target=self._worker, daemon=True) for _ in range(cfg.cpu_workers)]
        for t in self.threads:
            t.start()

    def submit(self, job: FarJob) -> Optional[Future]:
        max_far = int(job.far_lens_np.max()) if len(job.far_lens_np) else 0  # ok: FC101
        if max_far == 0:
            return None
        fut: Future = Future()
        self.jobs.put((job, fut))
        return fut

    def _worker(self) -> None:
        while True:
            job, fut = self.jobs.get()
            try:
                job.ready.synchronize()  # worker thread: waits for the query copy, never on the step loop
                n = len(job.rows_np)
                for j, row in enumerate(job.rows_np):
                    o, lse = attend_far_chunked(job.q_host[row], self.k_host[job.layer], self.v_host[job.layer],
                                                job.far_pages[j], int(job.far_lens_np[j]), self.scale)
                    self.o_host[j].copy_(o)
                    self.lse_host[j].copy_(lse)
                fut.set_result((self.o_host[:n], self.lse_host[:n]))
            except Exception as exc:  # surfaced to the step loop through the future
                fut.set_exception(exc)
