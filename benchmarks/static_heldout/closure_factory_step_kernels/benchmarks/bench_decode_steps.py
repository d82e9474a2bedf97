"""Times the eager decode wrapper's plan + run at a few batch sizes (tooling, not engine code)."""

from __future__ import annotations

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from cfserve.config import EngineConfig

WORKSPACE_BYTES = 128 * 1024 * 1024


def bench_eager_decode(cfg: EngineConfig, bs: int, seq_len: int, iters: int) -> float:
    dev = torch.device("cuda", 0)
    ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=dev)  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, cfg.kv_layout)
    pages_per_seq = (seq_len + cfg.page_size - 1) // cfg.page_size
    kv_indptr = torch.arange(bs + 1, dtype=torch.int32, device=dev) * pages_per_seq
    kv_indices = torch.arange(bs * pages_per_seq, dtype=torch.int32, device=dev)
    last = torch.full((bs,), (seq_len - 1) % cfg.page_size + 1, dtype=torch.int32, device=dev)
    kv = torch.randn(bs * pages_per_seq, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.dtype, device=dev)
    q = torch.randn(bs, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        w.plan(kv_indptr, kv_indices, last, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim,  # ok: FC102
               cfg.page_size, q_data_type=cfg.dtype, kv_data_type=cfg.dtype)
        w.run(q, kv)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    cfg = EngineConfig()
    for bs in (1, 8, 32, 64):
        print(f"bs={bs:3d}  plan+run {bench_eager_decode(cfg, bs, args.seq_len, args.iters):.3f} ms")


if __name__ == "__main__":
    main()
