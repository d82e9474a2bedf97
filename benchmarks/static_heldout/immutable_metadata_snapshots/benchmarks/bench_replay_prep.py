"""Time the replay preparation of each decode bucket against the trtllm-gen overflow kernel."""

from __future__ import annotations

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from snapattn.workspace import trtllm_workspace_bytes
from snapserve.batch import Request
from snapserve.config import EngineConfig
from snapruntime.executor import StepExecutor


def bench_replay_prep(cfg: EngineConfig, iters: int) -> None:
    ex = StepExecutor(cfg, torch.device("cuda"))
    ex.runner.capture_all()
    for bs in ex.runner.buckets:
        reqs = [Request(f"r{i}", list(range(40)), pages=[3 * i, 3 * i + 1, 3 * i + 2]) for i in range(bs)]
        for r in reqs:
            r.num_computed = r.seq_len - 1
        ex.batch.fill(reqs)
        ex.batch.upload()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(iters):
            meta = ex.runner.prepare_replay(ex.batch)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / iters * 1e6
        last = ex.runner.current[bs]
        print(f"bs={bs:3d} prep={dt:7.1f}us pages={last.kv_indptr[-1].item()} entry={meta.snapshot.bucket}")


def bench_eager_decode(cfg: EngineConfig, iters: int) -> None:
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    bs = 32
    indptr = torch.arange(bs + 1, dtype=torch.int32) * 4
    indices = torch.arange(bs * 4, dtype=torch.int32, device="cuda")
    last = torch.full((bs,), 7, dtype=torch.int32)
    w.plan(indptr, indices, last, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
    q = torch.randn(bs, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * 4, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        w.run(q, kv)
    torch.cuda.synchronize()
    print(f"eager fa2 decode bs={bs}: {(time.perf_counter() - t0) / iters * 1e6:.1f}us")


def bench_trtllm_overflow(cfg: EngineConfig, iters: int) -> None:
    ws = torch.empty(trtllm_workspace_bytes(cfg), dtype=torch.uint8, device="cuda")  # expect: FC105
    bs = cfg.max_num_reqs
    q = torch.randn(bs, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * 4, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(bs * 4, dtype=torch.int32, device="cuda").view(bs, 4)
    lens = torch.full((bs,), 4 * cfg.page_size, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 4 * cfg.page_size, cfg.head_dim ** -0.5, 1.0)
    torch.cuda.synchronize()
    print(f"trtllm-gen overflow bs={bs}: {(time.perf_counter() - t0) / iters * 1e6:.1f}us")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--trtllm", action="store_true")
    args = ap.parse_args()
    cfg = EngineConfig(use_trtllm_decode=args.trtllm, max_seq_len=4096)
    bench_replay_prep(cfg, args.iters)
    bench_eager_decode(cfg, args.iters)
    bench_trtllm_overflow(cfg, args.iters)


if __name__ == "__main__":
    main()
