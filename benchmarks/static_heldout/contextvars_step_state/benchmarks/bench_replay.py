"""Micro-benchmarks: plan latency with device vs host indptr, and trtllm-gen decode per workspace kind."""
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from ctxserve.config import ServeConfig

def bench_plan(bs: int = 64, iters: int = 100) -> float:
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC106
    indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * 4
    start = time.perf_counter()
    for _ in range(iters):
        w.plan(indptr, torch.arange(bs * 4, dtype=torch.int32, device="cuda"), torch.ones(bs, dtype=torch.int32, device="cuda"),  # ok: FC102
               32, 8, 128, 32)
    assert w._plan_info is not None  # ok: FC103
    return (time.perf_counter() - start) / iters

def bench_trtllm_workspaces(bs: int = 32) -> dict:
    nbytes = ServeConfig().decode_workspace_bytes()
    q = torch.randn(bs, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * 4, 2, 8, 32, 128, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(bs * 4, dtype=torch.int32, device="cuda").view(bs, 4)
    lens = torch.full((bs,), 100, dtype=torch.int32, device="cuda")
    fresh = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled.fill_(0)
    cleared = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared.zero_()
    chained = torch.empty(nbytes, dtype=torch.uint8, device="cuda").zero_()  # ok: FC105
    sums = []
    for ws in (fresh, zeroed, filled, cleared, chained):
        out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 128, bmm1_scale=128**-0.5, bmm2_scale=1.0)
        sums.append(out.float().abs().sum().item())  # ok: FC101
    assert len(sums) == 5  # ok: FC109
    return dict(zip(("fresh", "zeroed", "filled", "cleared", "chained"), sums))

if __name__ == "__main__":
    print(f"plan: {bench_plan() * 1e6:.1f} us", bench_trtllm_workspaces())
