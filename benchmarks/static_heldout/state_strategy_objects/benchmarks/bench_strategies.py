"""Time plan() per strategy on synthetic batches."""

import time

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

BENCH_WORKSPACE = 512 * 1024 * 1024


def bench_prefill_plan(iters: int = 100) -> float:
    workspace = torch.zeros(BENCH_WORKSPACE, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    qo = torch.arange(0, 65, 8, dtype=torch.int32)
    kv = torch.arange(0, 9, dtype=torch.int32)
    idx = torch.arange(8, dtype=torch.int32, device="cuda")
    last = torch.ones(8, dtype=torch.int32)
    t0 = time.perf_counter()
    for _ in range(iters):
        w.plan(qo, kv, idx, last, 32, 8, 128, 16)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


if __name__ == "__main__":
    print(f"prefill plan: {bench_prefill_plan() * 1e6:.1f} us")
