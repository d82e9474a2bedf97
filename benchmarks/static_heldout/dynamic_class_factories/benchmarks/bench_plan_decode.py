"""Time plan() and run() of the decode wrapper for a range of batch sizes.

    python benchmarks/bench_plan_decode.py --seq-len 2048
"""

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

BENCH_WORKSPACE_BYTES = 128 * 1024 * 1024


def bench_plan(bs: int, seq_len: int, page_size: int = 16, iters: int = 50) -> float:
    ws = torch.empty(BENCH_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    pages = (seq_len + page_size - 1) // page_size
    indptr = (torch.arange(bs + 1, dtype=torch.int32) * pages).cuda()
    indices = torch.arange(bs * pages, dtype=torch.int32, device="cuda")
    last = torch.full((bs,), (seq_len - 1) % page_size + 1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()  # ok: FC101
    t0 = time.perf_counter()
    for _ in range(iters):
        # device arguments on purpose: this measures the implicit copy plan() makes
        w.plan(indptr, indices, last, 32, 8, 128, page_size)  # ok: FC102
    return (time.perf_counter() - t0) / iters


def bench_graph_run(bs: int, seq_len: int, page_size: int = 16) -> float:
    ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    pages = (seq_len + page_size - 1) // page_size
    kv = torch.randn(bs * pages, 2, page_size, 8, 128, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs, 32, 128, dtype=torch.bfloat16, device="cuda")
    w.plan(torch.arange(bs + 1, dtype=torch.int32) * pages, torch.arange(bs * pages, dtype=torch.int32),
           torch.full((bs,), page_size, dtype=torch.int32), 32, 8, 128, page_size)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, kv)  # ok: FC108
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        g.replay()
    end.record()
    end.synchronize()
    del out
    return start.elapsed_time(end) / 100


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=2048)
    args = ap.parse_args()
    for bs in (1, 8, 32, 128):
        print(f"bs={bs:4d} plan {bench_plan(bs, args.seq_len) * 1e6:8.1f} us  "
              f"graph run {bench_graph_run(bs, args.seq_len) * 1e3:8.1f} us")


if __name__ == "__main__":
    main()
