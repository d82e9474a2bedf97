"""Microbenchmark of the XQA FP8 decode kernel alone (not part of the service)."""

import time

import torch
from flashinfer.decode import xqa_batch_decode_with_kv_cache

WORKSPACE_BYTES = 128 * 1024 * 1024


def main(bs: int = 64, seq_len: int = 4096, heads: int = 32, kv_heads: int = 8, head_dim: int = 128) -> None:
    pages = seq_len // 16
    workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    q = torch.randn(bs, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * pages, 2, 16, kv_heads, head_dim, device="cuda").to(torch.float8_e4m3fn)
    block_tables = torch.arange(bs * pages, dtype=torch.int32, device="cuda").view(bs, pages)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int32, device="cuda")
    for _ in range(3):
        xqa_batch_decode_with_kv_cache(q, kv, workspace, block_tables, seq_lens, seq_len)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(100):
        xqa_batch_decode_with_kv_cache(q, kv, workspace, block_tables, seq_lens, seq_len)
    torch.cuda.synchronize()
    print(f"xqa fp8 decode bs={bs} len={seq_len}: {(time.perf_counter() - t0) * 10:.3f} ms")


if __name__ == "__main__":
    main()
