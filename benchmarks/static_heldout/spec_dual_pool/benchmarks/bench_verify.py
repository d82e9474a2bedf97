"""Times one verify replay at a fixed batch; run by hand on the benchmark box."""
import time

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper

WORKSPACE_BYTES = 128 * 1024 * 1024


def bench(num_iters: int = 100) -> float:
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD")
    qo_indptr = torch.arange(0, 65 * 4, 4, dtype=torch.int32)
    kv_indptr = torch.arange(0, 65 * 8, 8, dtype=torch.int32)
    last_page_len = torch.full((64,), 16, dtype=torch.int32)
    kv_indices = torch.arange(64 * 8, dtype=torch.int32, device="cuda")
    wrapper.plan(qo_indptr, kv_indptr, kv_indices, last_page_len, 32, 8, 128, 16, causal=True)
    q = torch.randn(64 * 4, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(64 * 8, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    start = time.perf_counter()
    for _ in range(num_iters):
        wrapper.run(q, kv)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / num_iters
