"""Micro-benchmark of the trtllm decode kernel on a fixed shape."""
import time

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache


def bench_trtllm_decode(bs: int = 32, kv_len: int = 4096) -> float:
    pages = kv_len // 16
    q = torch.randn(bs, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * pages, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(bs * pages, dtype=torch.int32, device="cuda").view(bs, pages)
    seq_lens = torch.full((bs,), kv_len, dtype=torch.int32, device="cuda")
    ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    t0 = time.perf_counter()
    for _ in range(50):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, kv_len, bmm1_scale=128**-0.5, bmm2_scale=1.0)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / 50
