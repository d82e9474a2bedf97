"""Time ModelRunner.step for decode batches of growing size (eager vs graph replay)."""

from __future__ import annotations

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from modserve.batch import ForwardBatch, ScheduledReq
from modserve.config import EngineConfig
from modserve.runtime.model_runner import ModelRunner

BENCH_WS_BYTES = 512 * 1024 * 1024


def _decode_batch(bs: int, ctx: int, device: torch.device) -> ForwardBatch:
    reqs = [ScheduledReq(f"r{i}", i, ctx, [1], [i * ctx + ctx - 1]) for i in range(bs)]
    return ForwardBatch.from_schedule(reqs, device, is_decode=True)


def bench_wrapper_plan(cfg: EngineConfig, bs: int, iters: int) -> float:
    ws = torch.zeros(BENCH_WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.arange(bs + 1, dtype=torch.int32)
    indices = torch.arange(bs, dtype=torch.int32, device="cuda")
    last = torch.ones(bs, dtype=torch.int32)
    t0 = time.perf_counter()
    for _ in range(iters):
        w.plan(indptr, indices, last, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, 16)
    return (time.perf_counter() - t0) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--eager", action="store_true")
    args = ap.parse_args()
    cfg = EngineConfig(num_layers=8, disable_cuda_graph=args.eager)
    runner = ModelRunner(cfg)
    for bs in (1, 8, 32, 128):
        fb = _decode_batch(bs, args.ctx, runner.device)
        runner.step(fb)
        torch.cuda.synchronize()  # ok: FC101
        t0 = time.perf_counter()
        for _ in range(args.iters):
            logits, _ = runner.step(fb)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / args.iters
        print(f"bs={bs:4d} step={dt * 1e3:7.3f} ms plan={bench_wrapper_plan(cfg, bs, 20) * 1e6:6.1f} us "
              f"argmax0={logits[0].argmax().item()}")


if __name__ == "__main__":
    main()
