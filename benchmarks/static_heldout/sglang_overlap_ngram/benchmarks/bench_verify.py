"""Micro-benchmark of the tree-mask verify kernel at a fixed shape."""
import time

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper


def bench(bs: int = 64, draft: int = 8, iters: int = 100) -> float:
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    qo = torch.arange(0, (bs + 1) * draft, draft, dtype=torch.int32)
    kv = torch.arange(0, (bs + 1) * 64, 64, dtype=torch.int32)
    wrapper.plan(qo, kv, torch.arange(bs * 64, dtype=torch.int32, device="cuda"), torch.ones(bs, dtype=torch.int32), 32, 8, 128, 1)
    q = torch.randn(bs * draft, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv_cache = torch.randn(bs * 64, 2, 8, 128, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        wrapper.run(q, kv_cache)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


if __name__ == "__main__":
    print(f"{bench() * 1e6:.1f} us")
