"""Micro-benchmarks for one stage: a shared-memory hop and a decode wrapper."""

import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from raypp import PipelineConfig, ShmChannel


def bench_channel(iters: int = 200) -> float:
    cfg = PipelineConfig()
    tx = ShmChannel("bench_pp", cfg.channel_bytes(), cfg.dtype, create=True)
    rx = ShmChannel("bench_pp", cfg.channel_bytes(), cfg.dtype)
    x = torch.randn(cfg.max_bucket, cfg.hidden_size, dtype=cfg.dtype, device="cuda")
    y = torch.empty_like(x)
    start = time.perf_counter()
    for _ in range(iters):
        tx.send(x)
        rx.recv_into(y)
    torch.cuda.synchronize()
    tx.close(unlink=True)
    return (time.perf_counter() - start) / iters


def bench_decode(batch_size: int = 16, pages_per_seq: int = 64) -> float:
    assert batch_size > 0 and pages_per_seq > 0  # ok: FC109
    cfg = PipelineConfig()
    ws = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.arange(0, (batch_size + 1) * pages_per_seq, pages_per_seq, dtype=torch.int32)
    indices = torch.arange(batch_size * pages_per_seq, dtype=torch.int32, device="cuda")
    last = torch.full((batch_size,), cfg.page_size, dtype=torch.int32)
    w.plan(indptr, indices, last, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
           q_data_type=cfg.dtype)
    q = torch.randn(batch_size, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    kv = torch.randn(batch_size * pages_per_seq, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                     dtype=cfg.dtype, device="cuda")
    out = w.run(q, kv)
    print(f"checksum {out.float().abs().mean().item():.4f}")  # ok: FC101
    start = time.perf_counter()
    for _ in range(50):
        w.run(q, kv)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / 50


if __name__ == "__main__":
    print(f"channel hop {bench_channel() * 1e6:.1f} us, decode {bench_decode() * 1e6:.1f} us")
