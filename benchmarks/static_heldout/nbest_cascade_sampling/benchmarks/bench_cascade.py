"""Microbenchmark: two-level cascade decode for n completions sharing a prompt.

    python benchmarks/bench_cascade.py --groups 16 --n 8 --prompt-len 4096
"""

from __future__ import annotations

import argparse

import torch
from flashinfer import MultiLevelCascadeAttentionWrapper

BENCH_WORKSPACE_BYTES = 256 * 1024 * 1024


def _time(fn, iters: int = 50) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def bench(groups: int, n: int, prompt_len: int, suffix_len: int, page_size: int = 16) -> None:
    heads, kv_heads, head_dim = 32, 8, 128
    ws = torch.zeros(BENCH_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    prompt_pages, suffix_pages = prompt_len // page_size, -(-suffix_len // page_size)
    bs = groups * n
    num_pages = groups * prompt_pages + bs * suffix_pages
    kv = torch.randn(num_pages, 2, page_size, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    last = suffix_len - (suffix_pages - 1) * page_size

    cascade = MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    cascade.plan(
        [torch.arange(0, bs + 1, n, dtype=torch.int32), torch.arange(bs + 1, dtype=torch.int32)],
        [torch.arange(0, (groups + 1) * prompt_pages, prompt_pages, dtype=torch.int32),
         torch.arange(0, (bs + 1) * suffix_pages, suffix_pages, dtype=torch.int32)],
        [torch.arange(groups * prompt_pages, dtype=torch.int32, device="cuda"),
         torch.arange(groups * prompt_pages, num_pages, dtype=torch.int32, device="cuda")],
        [torch.full((groups,), page_size, dtype=torch.int32), torch.full((bs,), last, dtype=torch.int32)],
        heads, kv_heads, head_dim, page_size, q_data_type=torch.bfloat16,
    )
    t_cascade = _time(lambda: cascade.run(q, kv))
    print(f"groups={groups} n={n} prompt={prompt_len} suffix={suffix_len}: cascade decode {t_cascade:.3f} ms")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=4096)
    ap.add_argument("--suffix-len", type=int, default=256)
    a = ap.parse_args()
    bench(a.groups, a.n, a.prompt_len, a.suffix_len)
