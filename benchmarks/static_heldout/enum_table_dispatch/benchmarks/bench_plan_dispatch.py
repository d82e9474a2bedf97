"""Measure the host cost of ``plan()`` as the recipe table issues it, with device and with host indptr."""

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper


def bench_decode_plan(bs: int, iters: int, page_size: int = 16, pages_per_req: int = 64, on_device: bool = True):
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    indptr = torch.arange(bs + 1, dtype=torch.int32) * pages_per_req
    last = torch.full((bs,), page_size, dtype=torch.int32)
    if on_device:
        indptr, last = indptr.cuda(), last.cuda()
    indices = torch.arange(bs * pages_per_req, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        wrapper.plan(indptr, indices, last, 32, 8, 128, page_size)  # ok: FC102
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    args = parser.parse_args()
    for bs in args.batch_sizes:
        dev = bench_decode_plan(bs, args.iters, on_device=True)
        host = bench_decode_plan(bs, args.iters, on_device=False)
        print(f"bs={bs:4d}  device indptr {dev:8.1f} us   host indptr {host:8.1f} us")


if __name__ == "__main__":
    main()
