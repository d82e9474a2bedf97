"""Plan-time and run-time micro-benchmark of the decode wrappers over the captured batch sizes.

    python benchmarks/bench_workspace.py --sizes 1 8 32 128
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from densefi.config import EngineConfig
from densefi.workspace import trtllm_workspace_bytes

BENCH_WORKSPACE_BYTES = 256 << 20


def host_page_lists(bs: int, pages_per_seq: int, page_size: int):
    indptr = torch.arange(0, (bs + 1) * pages_per_seq, pages_per_seq, dtype=torch.int32)
    last = torch.full((bs,), page_size, dtype=torch.int32)
    return indptr, last


def bench_plan(cfg: EngineConfig, sizes: list[int], pages_per_seq: int, iters: int) -> dict[int, float]:
    ws = torch.empty(BENCH_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrappers = {bs: BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2") for bs in sizes}
    timings = {}
    for bs, w in wrappers.items():
        indptr, last = host_page_lists(bs, pages_per_seq, cfg.page_size)
        indices = torch.arange(bs * pages_per_seq, dtype=torch.int32, device="cuda")
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            w.plan(indptr, indices, last, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
            samples.append(time.perf_counter() - t0)
        timings[bs] = median(samples) * 1e6
    return timings


def bench_trtllm(cfg: EngineConfig, sizes: list[int], pages_per_seq: int, iters: int) -> dict[int, float]:
    ws = torch.zeros(trtllm_workspace_bytes(cfg), dtype=torch.uint8, device="cuda")  # ok: FC105
    num_pages = max(sizes) * pages_per_seq
    kv = torch.randn(num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    timings = {}
    for bs in sizes:
        q = torch.randn(bs, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
        bt = torch.arange(bs * pages_per_seq, dtype=torch.int32, device="cuda").view(bs, pages_per_seq)
        seq_lens = torch.full((bs,), pages_per_seq * cfg.page_size, dtype=torch.int32, device="cuda")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            trtllm_batch_decode_with_kv_cache(
                query=q,
                kv_cache=kv,
                workspace_buffer=ws,
                block_tables=bt,
                seq_lens=seq_lens,
                max_seq_len=pages_per_seq * cfg.page_size,
                bmm1_scale=cfg.head_dim**-0.5,
                bmm2_scale=1.0,
            )
        end.record()
        end.synchronize()
        timings[bs] = start.elapsed_time(end) * 1e3 / iters
    return timings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--pages-per-seq", type=int, default=64)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    cfg = EngineConfig(max_num_seqs=max(args.sizes))
    plan_us = bench_plan(cfg, args.sizes, args.pages_per_seq, args.iters)
    run_us = bench_trtllm(cfg, args.sizes, args.pages_per_seq, args.iters)
    for bs in args.sizes:
        print(f"bs={bs:4d}  plan {plan_us[bs]:8.1f} us  trtllm decode {run_us[bs]:8.1f} us")


if __name__ == "__main__":
    main()
