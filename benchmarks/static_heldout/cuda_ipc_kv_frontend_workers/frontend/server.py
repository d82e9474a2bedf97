"""Frontend process: owns the page pool, exports it once, and drives one queue per worker."""

from typing import List

import numpy as np
import torch
import torch.multiprocessing as mp

from ipckv import MAX_WORKERS, IpcHandle, IpcPageRegistry, IpcServeConfig, SharedPagePool, StepMessage
from ipc_worker.loop import WorkerLoop


def worker_main(cfg: IpcServeConfig, worker_id: int, inbox, outbox, handle: IpcHandle) -> None:
    device = torch.device("cuda", handle.device_index)
    torch.cuda.set_device(device)
    loop = WorkerLoop(cfg, worker_id, device, inbox, outbox, handle)
    while True:
        loop.step()


class Frontend:
    def __init__(self, cfg: IpcServeConfig, num_workers: int, device: torch.device):
        if num_workers > MAX_WORKERS:
            raise ValueError(f"{num_workers} workers requested, at most {MAX_WORKERS} supported")
        self.cfg = cfg
        self.pool = SharedPagePool(cfg, cfg.max_pages, cfg.page_size, device)
        self.registry = IpcPageRegistry(cfg.max_pages, device)
        self.ctx = mp.get_context("spawn")
        self.inboxes = [self.ctx.Queue() for _ in range(num_workers)]
        self.outbox = self.ctx.Queue()
        self.procs: List = []
        self.step_id = 0
        self.epochs_np = np.zeros(cfg.max_pages, dtype=np.int64)

    def export_pool(self) -> IpcHandle:
        torch.cuda.synchronize()  # the pool must be fully written before a worker maps it
        handle = self.pool.export()
        self.registry.register(handle)
        return handle

    def start(self) -> None:
        handle = self.export_pool()
        for i, inbox in enumerate(self.inboxes):
            p = self.ctx.Process(target=worker_main, args=(self.cfg, i, inbox, self.outbox, handle), daemon=True)
            p.start()
            self.procs.append(p)

    def dispatch(self, worker: int, req_ids: List[int], tokens: List[np.ndarray], seq_lens: List[int],
                 page_tables: List[np.ndarray], bucket: int = 0) -> None:
        self.step_id += 1
        n_rows = len(req_ids)
        width = max(len(t) for t in page_tables)
        table = np.zeros((n_rows, width), dtype=np.int32)
        for i, t in enumerate(page_tables):
            table[i, : len(t)] = t
        ext = np.asarray([len(t) for t in tokens], dtype=np.int64)
        qo = np.zeros(n_rows + 1, dtype=np.int32)
        np.cumsum(ext, out=qo[1:])
        lens = np.asarray(seq_lens, dtype=np.int64)
        positions = np.concatenate([np.arange(s - e, s) for s, e in zip(lens, ext)]).astype(np.int64)
        msg = StepMessage(
            step_id=self.step_id,
            is_prefill=bool((ext > 1).any()),
            req_ids=list(req_ids),
            input_ids_np=np.concatenate(tokens).astype(np.int64),
            positions_np=positions,
            seq_lens_np=lens,
            qo_indptr_np=qo,
            page_table_np=table,
            peer_page_table_np=np.zeros((n_rows, 1), dtype=np.int32),
            peer_lens_np=np.zeros(n_rows, dtype=np.int64),
            epochs_np=self.epochs_np,
            bucket=bucket,
        )
        self.inboxes[worker].put(msg)
