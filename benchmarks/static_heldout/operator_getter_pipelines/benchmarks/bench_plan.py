"""Times decode/prefill plan() and a whole engine step on a drained device."""

from __future__ import annotations

import argparse
import functools
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from opserve.stages import PROFILE_STAGES, STEP_STAGES, StepContext, run_stage


def _timed(fn, iters: int) -> float:
    fn()
    torch.cuda.synchronize()  # ok: FC101
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def bench_decode_plan(bs: int, pages_per_req: int, iters: int) -> float:
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    indptr = torch.arange(0, bs * pages_per_req + 1, pages_per_req, dtype=torch.int32)
    indices = torch.arange(bs * pages_per_req, dtype=torch.int32, device="cuda")
    last = torch.full((bs,), 7, dtype=torch.int32)
    return _timed(functools.partial(w.plan, indptr, indices, last, 32, 8, 128, 16), iters)


def bench_prefill_plan(bs: int, tokens_per_req: int, iters: int) -> float:
    ws = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    qo_indptr = torch.arange(0, bs * tokens_per_req + 1, tokens_per_req, dtype=torch.int32)
    plan = functools.partial(w.plan, num_qo_heads=32, num_kv_heads=8, head_dim_qk=128, causal=True)
    return _timed(lambda: plan(qo_indptr, qo_indptr), iters)


def bench_step(runner, batch, iters: int) -> float:
    stages = PROFILE_STAGES + STEP_STAGES + PROFILE_STAGES

    def one_step():
        functools.reduce(run_stage, stages, StepContext(runner=runner, batch=batch))

    return _timed(one_step, iters)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    print(f"decode plan:  {bench_decode_plan(args.bs, 64, args.iters):8.1f} us")
    print(f"prefill plan: {bench_prefill_plan(args.bs, 512, args.iters):8.1f} us")


if __name__ == "__main__":
    main()
