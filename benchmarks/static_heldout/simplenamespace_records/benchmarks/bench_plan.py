"""Time plan() + run() of the eager decode wrapper over synthetic step records.

    python benchmarks/bench_plan.py --batch 64 --context 2048
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from nsattn.plan_kwargs import decode_plan_kwargs
from nsserve.batch import host_layout
from nsserve.config import load_config, to_namespace
from nsserve.records import make_record

BENCH_WORKSPACE_BYTES = 256 * 1024 * 1024


def synthetic_record(batch: int, context: int, page_size: int) -> object:
    rng = np.random.default_rng(0)
    seq_lens = rng.integers(context // 2, context, size=batch).astype(np.int32)
    layout = host_layout(seq_lens, np.ones(batch, dtype=np.int32), page_size)
    nnz = int(layout["kv_indptr"][-1])
    return make_record(
        mode="decode",
        batch_size=batch,
        kv_indptr_cpu=torch.from_numpy(layout["kv_indptr"]),
        kv_last_page_len_cpu=torch.from_numpy(layout["kv_last_page_len"]),
        kv_indices=torch.arange(nnz, dtype=torch.int32, device="cuda"),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()

    cfg = to_namespace(load_config({"num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}, {}))
    ws = torch.empty(BENCH_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, cfg.kv_layout)
    rec = synthetic_record(args.batch, args.context, cfg.page_size)
    num_pages = int(rec.kv_indptr_cpu[-1])
    kv = torch.randn(num_pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.torch_dtype, device="cuda")
    q = torch.randn(args.batch, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.torch_dtype, device="cuda")

    plan_s = run_s = 0.0
    for _ in range(args.iters):
        t0 = time.perf_counter()
        w.plan(**decode_plan_kwargs(cfg, indptr=rec.kv_indptr_cpu, indices=rec.kv_indices, last_page_len=rec.kv_last_page_len_cpu))
        t1 = time.perf_counter()
        w.run(q, (kv, kv))
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        plan_s += t1 - t0
        run_s += t2 - t1
    print(f"plan {plan_s / args.iters * 1e6:.1f} us  run {run_s / args.iters * 1e6:.1f} us  (batch={args.batch})")


if __name__ == "__main__":
    main()
