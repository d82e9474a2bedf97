"""Cost of the compat layer's keyword filtering next to the plan() it feeds.

    python benchmarks/bench_plan_kwargs.py --bs 64 --kv-len 4096
"""

import argparse
import time

import torch

from compatserve import compat
from compatserve.attention import planning
from compatserve.config import EngineConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bs", type=int, default=64)
    ap.add_argument("--kv-len", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()

    cfg = EngineConfig(model_path="bench", max_batch_size=args.bs)
    dev = torch.device("cuda")
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device=dev)  # ok: FC106
    wrapper = compat.make_decode_wrapper(workspace, "NHD")

    pages = (args.kv_len + cfg.page_size - 1) // cfg.page_size
    indptr = torch.arange(0, (args.bs + 1) * pages, pages, dtype=torch.int32)
    indices = torch.arange(args.bs * pages, dtype=torch.int32, device=dev)
    last = torch.full((args.bs,), cfg.page_size, dtype=torch.int32)
    kw = planning.decode_plan_kwargs(cfg, indptr, indices, last)

    t0 = time.perf_counter()
    for _ in range(args.iters):
        compat.filter_plan_kwargs(wrapper, kw)
    t_filter = (time.perf_counter() - t0) / args.iters

    torch.cuda.synchronize()  # ok: FC101
    t0 = time.perf_counter()
    for _ in range(args.iters):
        wrapper.plan(**compat.filter_plan_kwargs(wrapper, kw))
    torch.cuda.synchronize()
    t_plan = (time.perf_counter() - t0) / args.iters
    print(f"flashinfer {compat.FLASHINFER_VERSION}: filter {t_filter * 1e6:.1f} us, plan {t_plan * 1e6:.1f} us")

    if compat.trtllm_batch_decode_with_kv_cache is not None:
        trt_ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)  # ok: FC105
        trt_ws.zero_()
        q = torch.randn(args.bs, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device=dev)
        kv = torch.randn(args.bs * pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=cfg.dtype, device=dev)
        block_tables = indices.view(args.bs, pages)
        seq_lens = torch.full((args.bs,), args.kv_len, dtype=torch.int32, device=dev)
        compat.trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv, workspace_buffer=trt_ws, block_tables=block_tables,
            seq_lens=seq_lens, max_seq_len=args.kv_len, bmm1_scale=cfg.head_dim ** -0.5, bmm2_scale=1.0,
        )
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
