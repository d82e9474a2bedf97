"""Cost of dispatching a decode step by name vs. a direct call, and of one captured decode bucket.

    python benchmarks/bench_step_dispatch.py --bs 64 --iters 200
"""

import argparse
import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from rpcserve.rpc import run_method


class _Target:
    def execute_model(self, x):
        return x


def bench_dispatch(iters: int) -> tuple[float, float]:
    t = _Target()
    start = time.perf_counter()
    for i in range(iters):
        t.execute_model(i)
    direct = time.perf_counter() - start
    start = time.perf_counter()
    for i in range(iters):
        run_method(t, "execute_model", (i,))
    return direct, time.perf_counter() - start


def fill_pages(indices: torch.Tensor, num_pages: int) -> None:
    indices[:num_pages].copy_(torch.randperm(num_pages, device=indices.device, dtype=torch.int32))


def capture_decode_bucket(bs: int, pages_per_req: int, iters: int) -> float:
    heads, kv_heads, dim, page = 32, 8, 128, 16
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    graph_ws = torch.zeros(256 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    indptr = torch.arange(0, (bs + 1) * pages_per_req, pages_per_req, dtype=torch.int32, device="cuda")
    indices = torch.empty(bs * pages_per_req, dtype=torch.int32, device="cuda")
    last = torch.full((bs,), page, dtype=torch.int32, device="cuda")
    backend = "trtllm-gen" if torch.cuda.get_device_capability()[0] >= 10 else "fa2"
    graph_w = BatchDecodeWithPagedKVCacheWrapper(
        graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last, backend=backend,
    )
    fill_pages(indices, bs * pages_per_req)
    eager_w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr_cpu, last_cpu = indptr.cpu(), last.cpu()
    for w in (graph_w, eager_w):
        w.plan(indptr_cpu, indices, last_cpu, heads, kv_heads, dim, page, q_data_type=torch.bfloat16)
    q = torch.randn(bs, heads, dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(bs * pages_per_req, 2, page, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    reference = graph_w.run(q, kv)
    eager_w.run(q, kv)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        # planned once above and never re-planned: the captured pointers stay valid
        out = eager_w.run(q, kv)  # ok: FC108
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        g.replay()
    torch.cuda.synchronize()
    print("max diff vs graph-mode wrapper", (out - reference).abs().max().item())
    return (time.perf_counter() - start) / iters


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bs", type=int, default=64)
    p.add_argument("--pages", type=int, default=64)
    p.add_argument("--iters", type=int, default=200)
    args = p.parse_args()
    direct, by_name = bench_dispatch(args.iters * 1000)
    print(f"direct {direct * 1e9 / (args.iters * 1000):.1f} ns/call, run_method {by_name * 1e9 / (args.iters * 1000):.1f} ns/call")
    print(f"decode replay bs={args.bs}: {capture_decode_bucket(args.bs, args.pages, args.iters) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
