"""Plan and run latency of the decode paths at fixed batch sizes.

    python benchmarks/bench_plan.py --bs 1 8 64 256 --pages-per-req 64
"""

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

BENCH_WORKSPACE_BYTES = 128 * 1024 * 1024
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16


def _inputs(bs: int, pages_per_req: int):
    indptr_d = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * pages_per_req
    indices_d = torch.arange(bs * pages_per_req, dtype=torch.int32, device="cuda")
    last_d = torch.full((bs,), PAGE_SIZE, dtype=torch.int32, device="cuda")
    return indptr_d, indices_d, last_d


def _zeroed_workspace(nbytes: int) -> torch.Tensor:
    ws = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    return ws


def bench_fa2_plan(bs: int, pages_per_req: int, iters: int) -> float:
    ws = torch.zeros(BENCH_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "HND")
    indptr_d, indices_d, last_d = _inputs(bs, pages_per_req)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        # device inputs on purpose: measures plan() including its own D2H copies
        w.plan(indptr_d, indices_d, last_d, NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE)  # ok: FC102
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def bench_trtllm_decode(bs: int, pages_per_req: int, iters: int) -> float:
    ws = torch.empty(BENCH_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC105
    kv = torch.randn(bs * pages_per_req, 2, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs, NUM_QO_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(bs * pages_per_req, dtype=torch.int32, device="cuda").view(bs, pages_per_req)
    seq_lens = torch.full((bs,), pages_per_req * PAGE_SIZE, dtype=torch.int32, device="cuda")
    max_len = pages_per_req * PAGE_SIZE
    for _ in range(3):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, max_len, bmm1_scale=HEAD_DIM**-0.5)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, max_len, bmm1_scale=HEAD_DIM**-0.5)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def bench_trtllm_decode_zeroed(bs: int, pages_per_req: int, iters: int) -> float:
    ws = _zeroed_workspace(BENCH_WORKSPACE_BYTES)
    kv = torch.randn(bs * pages_per_req, 2, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs, NUM_QO_HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(bs * pages_per_req, dtype=torch.int32, device="cuda").view(bs, pages_per_req)
    seq_lens = torch.full((bs,), pages_per_req * PAGE_SIZE, dtype=torch.int32, device="cuda")
    max_len = pages_per_req * PAGE_SIZE
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, max_len, bmm1_scale=HEAD_DIM**-0.5)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--pages-per-req", type=int, default=64)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--trtllm", action="store_true")
    args = ap.parse_args()
    for bs in args.bs:
        line = f"bs={bs:4d}  fa2 plan {bench_fa2_plan(bs, args.pages_per_req, args.iters):8.1f} us"
        if args.trtllm:
            line += f"  trtllm {bench_trtllm_decode(bs, args.pages_per_req, args.iters):8.1f} us"
            line += f"  trtllm(zeroed) {bench_trtllm_decode_zeroed(bs, args.pages_per_req, args.iters):8.1f} us"
        print(line)


if __name__ == "__main__":
    main()
