"""Host planner thread: turns scheduled batches into numpy plans one step ahead and feeds the step's queue."""
import logging
import queue
import threading
from typing import Optional

import numpy as np
import torch

from engine.attention import FlashInferAttention
from poolserve import DECODE_BUCKETS, HostPlan, StepBatch

logger = logging.getLogger(__name__)


class HostPlanner(threading.Thread):
    def __init__(self, attn: FlashInferAttention, page_table_np: np.ndarray):
        super().__init__(name="host-planner", daemon=True)
        self.attn, self.cfg, self.page_table_np = attn, attn.cfg, page_table_np
        self.inbox: "queue.Queue[Optional[StepBatch]]" = queue.Queue(maxsize=2)
        self.out: "queue.Queue[HostPlan]" = queue.Queue(maxsize=2)
        self.slots_dev = torch.zeros(self.cfg.max_batch_size, dtype=torch.int64, device=attn.device)
        self.slots_host = torch.zeros(self.cfg.max_batch_size, dtype=torch.int64, pin_memory=True)

    def submit(self, batch: StepBatch) -> None:
        assert batch.batch_size > 0, "the scheduler handed over an empty step"  # expect: FC109
        self.inbox.put(batch)

    def run(self) -> None:
        while (batch := self.inbox.get()) is not None:
            self.run_once(batch)

    def run_once(self, batch: StepBatch) -> None:
        n, ps, window = batch.batch_size, self.cfg.page_size, self.cfg.sliding_window
        bucket = next((b for b in DECODE_BUCKETS if b >= n), n)
        lens = batch.seq_lens.cpu().numpy()  # expect: FC101
        slots = batch.req_slots_cpu.numpy()  # ok: FC101
        if n > self.slots_host.numel():
            self.slots_host = torch.zeros(2 * n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        if n > self.slots_dev.numel():
            self.slots_dev = torch.empty(2 * n, dtype=torch.int64, device=self.attn.device)  # expect: FC107
        self.slots_host[:n].copy_(batch.req_slots_cpu)
        self.slots_dev[:n].copy_(self.slots_host[:n], non_blocking=True)  # ok: FC104
        pages = (lens + ps - 1) // ps
        skip = np.maximum(lens - window, 0) // ps if window > 0 else np.zeros_like(pages)
        kv_indptr, win_indptr = np.zeros(bucket + 1, np.int32), np.zeros(bucket + 1, np.int32)
        np.cumsum(pages, out=kv_indptr[1 : n + 1])
        np.cumsum(pages - skip, out=win_indptr[1 : n + 1])
        kv_indptr[n + 1 :], win_indptr[n + 1 :] = kv_indptr[n], win_indptr[n]
        rows = [self.page_table_np[s] for s in slots]
        kv_indices = np.concatenate([r[:p] for r, p in zip(rows, pages)])  # ok: FC101
        win_indices = np.concatenate([r[k:p] for r, k, p in zip(rows, skip, pages)])
        total = int(kv_indptr[n])  # ok: FC101
        if bucket in self.attn.graph_bufs:  # upload the page list while the GPU still runs the previous step
            staged = self.attn.graph_bufs[bucket].kv_indices
            staged[:total].copy_(torch.from_numpy(kv_indices), non_blocking=True)  # expect: FC104
        last_page_len = np.ones(bucket, np.int32)
        last_page_len[:n] = (lens - 1) % ps + 1
        extend_cpu = None if batch.is_decode else batch.extend_lens_cpu.numpy()
        qo_indptr = None if extend_cpu is None else np.concatenate([[0], np.cumsum(extend_cpu)]).astype(np.int32)
        logger.info(f"planned step {batch.step_id} into bucket {bucket}: slots {batch.req_slots}")  # expect: FC101
        self.out.put(
            HostPlan(batch.step_id, bucket, n, kv_indptr, kv_indices, last_page_len, win_indptr, win_indices, qo_indptr)
        )
