"""Decode step latency: graph replay vs eager, and the raw decode kernels.

    python benchmarks/bench_decode_step.py --bs 1 8 32 --iters 200
"""

import argparse
import time

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from wrl.batch import ForwardMode, ScheduleBatch
from wrl.config import EngineConfig
from wrl.model_runner import ModelRunner

WS_BYTES = 256 * 1024 * 1024


def _batch(bs: int, seq_len: int) -> ScheduleBatch:
    return ScheduleBatch(
        forward_mode=ForwardMode.DECODE,
        rids_np=np.arange(bs, dtype=np.int64),
        req_pool_indices_np=np.arange(bs, dtype=np.int32),
        seq_lens_np=np.full(bs, seq_len, dtype=np.int32),
        input_ids_np=np.ones(bs, dtype=np.int64),
    )


def bench_engine(runner: ModelRunner, bs: int, seq_len: int, iters: int) -> float:
    batch = _batch(bs, seq_len)
    for _ in range(5):
        runner.step(batch)
    torch.cuda.synchronize()  # ok: FC101
    t0 = time.perf_counter()
    for _ in range(iters):
        out = runner.step(batch)
    out.resolve()
    return (time.perf_counter() - t0) / iters * 1e6


def bench_fa2_kernel(bs: int, seq_len: int, iters: int, page_size: int = 16) -> float:
    dev = torch.device("cuda")
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device=dev)  # ok: FC105
    pages = (seq_len + page_size - 1) // page_size
    indptr = torch.arange(0, (bs + 1) * pages, pages, dtype=torch.int32)
    indices = torch.arange(bs * pages, dtype=torch.int32, device=dev)
    last = torch.full((bs,), (seq_len - 1) % page_size + 1, dtype=torch.int32)
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, 32, 8, 128, page_size, q_data_type=torch.bfloat16)
    q = torch.randn(bs, 32, 128, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(bs * pages, 2, page_size, 8, 128, dtype=torch.bfloat16, device=dev)
    w.run(q, kv)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        w.run(q, kv)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def bench_trtllm_kernel(bs: int, seq_len: int, iters: int, page_size: int = 16) -> float:
    dev = torch.device("cuda")
    ws = torch.empty(WS_BYTES, dtype=torch.uint8, device=dev)  # expect: FC105
    pages = (seq_len + page_size - 1) // page_size
    block_tables = torch.arange(bs * pages, dtype=torch.int32, device=dev).view(bs, pages)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int32, device=dev)
    q = torch.randn(bs, 32, 128, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(bs * pages, 2, 8, page_size, 128, dtype=torch.bfloat16, device=dev)
    scale = 128**-0.5
    trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, max_seq_len=seq_len, bmm1_scale=scale)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, max_seq_len=seq_len, bmm1_scale=scale)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def bench_prefill_kernel(bs: int, seq_len: int, iters: int) -> float:
    dev = torch.device("cuda")
    workspace = torch.zeros(WS_BYTES, dtype=torch.uint8, device=dev)  # ok: FC106
    qo_indptr = torch.arange(0, (bs + 1) * seq_len, seq_len, dtype=torch.int32)
    w = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    w.plan(qo_indptr, qo_indptr, 32, 8, 128, causal=True, q_data_type=torch.bfloat16)
    q = torch.randn(bs * seq_len, 32, 128, dtype=torch.bfloat16, device=dev)
    k = torch.randn(bs * seq_len, 8, 128, dtype=torch.bfloat16, device=dev)
    v = torch.randn_like(k)
    w.run(q, k, v)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        w.run(q, k, v)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()

    runner = ModelRunner(EngineConfig(model_path="dummy", num_layers=4, cuda_graph_max_bs=max(args.bs)))
    runner.init_cuda_graphs()
    for bs in args.bs:
        engine_us = bench_engine(runner, bs, args.seq_len, args.iters)
        fa2_us = bench_fa2_kernel(bs, args.seq_len, args.iters)
        trt_us = bench_trtllm_kernel(bs, args.seq_len, args.iters)
        print(f"bs={bs:4d} engine step {engine_us:8.1f} us  fa2 {fa2_us:8.1f} us  trtllm-gen {trt_us:8.1f} us")
    print(f"ragged prefill 4x{args.seq_len}: {bench_prefill_kernel(4, args.seq_len, 20):8.1f} us")


if __name__ == "__main__":
    main()
