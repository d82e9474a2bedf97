"""Times the kv-indices kernels and an FA2 decode plan at serving batch sizes (python -m benchmarks.bench_kv_indices)."""

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from tkv_kernels.index_kernels import launch_build_kv_indptr, launch_create_kv_indices

WORKSPACE_BYTES = 128 * 1024 * 1024


def bench(bs, avg_len, iters=50):
    max_len = 2 * avg_len
    req_to_token = torch.randint(0, 1 << 20, (bs, max_len), dtype=torch.int32, device="cuda")
    req_pool_indices = torch.arange(bs, device="cuda")
    seq_lens = torch.randint(1, max_len, (bs,), dtype=torch.int32, device="cuda")
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32, device="cuda")
    launch_build_kv_indptr(seq_lens, kv_indptr, bs)
    kv_indices = torch.empty(kv_indptr[-1].item(), dtype=torch.int32, device="cuda")

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        launch_create_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices, bs)
    torch.cuda.synchronize()
    t_kernel = (time.perf_counter() - t0) / iters

    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    indptr_cpu = kv_indptr.cpu()
    last_page_len_cpu = torch.ones(bs, dtype=torch.int32)
    t0 = time.perf_counter()
    for _ in range(iters):
        wrapper.plan(indptr_cpu, kv_indices, last_page_len_cpu, 32, 8, 128, 1)
    t_plan = (time.perf_counter() - t0) / iters
    return t_kernel, t_plan


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--avg-len", type=int, default=2048)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64, 160])
    args = parser.parse_args()
    for bs in args.batch_sizes:
        t_kernel, t_plan = bench(bs, args.avg_len)
        print(f"bs={bs:4d} kv_indices {t_kernel * 1e6:8.1f} us  plan {t_plan * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
