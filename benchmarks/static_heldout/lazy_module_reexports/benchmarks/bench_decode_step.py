"""Decode step latency: ModelRunner.step over graph buckets, and the raw trtllm-gen kernel."""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

import lazyserve
from lazyserve.batch import ForwardMode, ScheduledBatch

WORKSPACE_BYTES = 128 * 1024 * 1024


def make_decode_batch(bs: int, seq_len: int, page_size: int) -> ScheduledBatch:
    pages = (seq_len + page_size - 1) // page_size
    table = np.arange(1, 1 + bs * pages, dtype=np.int32).reshape(bs, pages)
    return ScheduledBatch(
        forward_mode=ForwardMode.DECODE,
        req_ids=tuple(f"b{i}" for i in range(bs)),
        input_ids=[1] * bs,
        positions=[seq_len - 1] * bs,
        seq_lens=[seq_len] * bs,
        extend_lens=[1] * bs,
        page_table_rows=table,
        out_cache_loc=[int(table[i, -1]) * page_size + (seq_len - 1) % page_size for i in range(bs)],
        temperatures=[0.7] * bs,
        top_k=[20] * bs,
        output_lens=[8] * bs,
        min_new_tokens=[0] * bs,
    )


def bench_step(runner, bs: int, seq_len: int, iters: int) -> float:
    sched = make_decode_batch(bs, seq_len, runner.cfg.page_size)
    for _ in range(3):
        runner.step(sched).ready.synchronize()
    torch.cuda.synchronize()  # ok: FC101
    start = time.perf_counter()
    for _ in range(iters):
        out = runner.step(sched)
    out.ready.synchronize()
    elapsed = (time.perf_counter() - start) / iters
    print(f"bs={bs:4d} seq={seq_len:6d} step={elapsed * 1e3:.3f} ms first={out.next_token_ids[0].item()}")
    return elapsed


def bench_kernel(bs: int, seq_len: int, page_size: int, iters: int) -> float:
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105, FC106
    ws.zero_()
    pages = (seq_len + page_size - 1) // page_size
    q = torch.randn(bs, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * pages + 1, 2, 8, page_size, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(1, 1 + bs * pages, dtype=torch.int32, device="cuda").view(bs, pages)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int32, device="cuda")
    for _ in range(3):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, seq_len, bmm1_scale=128**-0.5, bmm2_scale=1.0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, seq_len, bmm1_scale=128**-0.5, bmm2_scale=1.0)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters


def bench_fa2_plan(bs: int, seq_len: int, page_size: int, iters: int) -> float:
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), "NHD")
    pages = (seq_len + page_size - 1) // page_size
    indptr = torch.arange(0, (bs + 1) * pages, pages, dtype=torch.int32, device="cuda")
    indices = torch.arange(bs * pages, dtype=torch.int32, device="cuda")
    last = torch.full((bs,), (seq_len - 1) % page_size + 1, dtype=torch.int32, device="cuda")
    start = time.perf_counter()
    for _ in range(iters):
        w.plan(indptr, indices, last, 32, 8, 128, page_size)  # ok: FC102
    return (time.perf_counter() - start) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--backend", default="flashinfer")
    args = ap.parse_args()
    cfg = lazyserve.EngineConfig(attention_backend=args.backend)
    runner = lazyserve.ModelRunner(cfg)
    for bs in args.batch_sizes:
        bench_step(runner, bs, args.seq_len, args.iters)
        if args.backend == "trtllm":
            t = bench_kernel(bs, args.seq_len, cfg.page_size, args.iters)
            print(f"  trtllm kernel {t * 1e6:.1f} us")
        t = bench_fa2_plan(bs, args.seq_len, cfg.page_size, args.iters)
        print(f"  fa2 plan (device indptr) {t * 1e6:.1f} us")


if __name__ == "__main__":
    main()
