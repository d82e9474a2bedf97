"""Acceptance and step time of the overlapped worker on a synthetic batch."""
import time

import torch

from dso.spec.worker import OverlapSpecWorker, SpecBatch


def bench_step(worker: OverlapSpecWorker, batch: SpecBatch, iters: int = 50) -> dict:
    assert iters > 0  # ok: FC109
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        worker.step(batch)
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / iters
    mean_accept = worker.accept_lens[: batch.batch_size].float().mean().item()  # ok: FC101
    return {"step_ms": dt * 1e3, "mean_accept": mean_accept}
