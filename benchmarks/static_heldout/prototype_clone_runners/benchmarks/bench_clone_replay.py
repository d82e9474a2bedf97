"""Replay latency of shallow vs deep bucket clones (python benchmarks/bench_clone_replay.py)."""

from __future__ import annotations

import argparse
import copy
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from protoserve.buffers import DecodeBuffers

BENCH_WORKSPACE_BYTES = 128 * 1024 * 1024


def bench_plan(shallow: bool, bs: int, iters: int) -> float:
    dev = torch.device("cuda")
    proto = DecodeBuffers(bs, bs * 64, dev)
    bufs = copy.copy(proto) if shallow else copy.deepcopy(proto)
    workspace = torch.zeros(BENCH_WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        "NHD",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=bufs.kv_indptr[: bs + 1],
        paged_kv_indices_buffer=bufs.kv_indices,
        paged_kv_last_page_len_buffer=bufs.kv_last_page_len[:bs],
    )
    bufs.kv_indptr_cpu[: bs + 1] = torch.arange(0, (bs + 1) * 64, 64, dtype=torch.int32)
    bufs.kv_last_page_len_cpu[:bs] = 16
    torch.cuda.synchronize()  # ok: FC101
    t0 = time.perf_counter()
    for _ in range(iters):
        w.plan(
            bufs.kv_indptr_cpu[: bs + 1],
            bufs.kv_indices[: bs * 64],
            bufs.kv_last_page_len_cpu[:bs],
            32,
            8,
            128,
            16,
        )
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    for bs in (1, 8, 32, 128):
        for shallow in (True, False):
            us = bench_plan(shallow, bs, args.iters)
            print(f"bs={bs:4d} {'shallow' if shallow else 'deep':7s} plan {us:8.1f} us")


if __name__ == "__main__":
    main()
