"""Decode throughput per workspace size and backend, one wrapper on one thread.

    python benchmarks/bench_workspace.py --bs 32 --seq-len 4096
"""

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from stlserve.config import EngineConfig

BENCH_WS_BYTES = 256 * 1024 * 1024


def bench_decode(backend: str, bs: int, seq_len: int, iters: int = 50) -> float:
    cfg = EngineConfig.get_instance()
    pages_per_seq = (seq_len + cfg.page_size - 1) // cfg.page_size
    ws = torch.zeros(BENCH_WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105, FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True, backend=backend)
    kv_indptr_gpu = torch.arange(bs + 1, dtype=torch.int32, device="cuda") * pages_per_seq
    indices = torch.arange(bs * pages_per_seq, dtype=torch.int32, device="cuda")
    last = torch.full((bs,), (seq_len - 1) % cfg.page_size + 1, dtype=torch.int32)
    w.plan(  # ok: FC102
        kv_indptr_gpu, indices, last, cfg.num_q_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
        q_data_type=cfg.dtype, kv_data_type=cfg.dtype,
    )
    q = torch.randn(bs, cfg.num_q_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    shape = (bs * pages_per_seq, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
    k = torch.randn(shape, dtype=cfg.dtype, device="cuda")
    v = torch.randn(shape, dtype=cfg.dtype, device="cuda")
    for _ in range(3):
        w.run(q, (k, v))
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        w.run(q, (k, v))
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--backends", default="fa2,trtllm-gen")
    args = ap.parse_args()
    for backend in args.backends.split(","):
        ms = bench_decode(backend, args.bs, args.seq_len)
        print(f"{backend:>10}  bs={args.bs}  seq_len={args.seq_len}  {ms:.3f} ms/step")


if __name__ == "__main__":
    main()
