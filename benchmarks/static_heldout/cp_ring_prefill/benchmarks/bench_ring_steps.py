"""Times the plan and run of one ring step against a single-GPU reference.

Benchmark code, run by hand on one GPU; it is not part of the serving path.
"""
from __future__ import annotations

import time

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper, single_prefill_with_kv_cache


def plan_and_time(seq_len: int = 32768, cp_size: int = 8, heads: int = 32, head_dim: int = 128, iters: int = 20):
    c = seq_len // (2 * cp_size)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    qo_indptr = torch.tensor([0, 2 * c], dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor([0, c], dtype=torch.int32, device="cuda")
    w.plan(qo_indptr, kv_indptr, heads, heads, head_dim, causal=False)  # ok: FC102
    q = torch.randn(2 * c, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(c, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        o, lse = w.run(q, k, v, return_lse=True)
    torch.cuda.synchronize()
    ring_ms = (time.perf_counter() - t0) * 1e3 / iters
    ref = single_prefill_with_kv_cache(q, k, v, causal=False)
    err = (o.float() - ref.float()).abs().max().item()  # ok: FC101
    print(f"ring step {2 * c}x{c}: {ring_ms:.3f} ms, max abs err {err:.2e}")


if __name__ == "__main__":
    plan_and_time()
