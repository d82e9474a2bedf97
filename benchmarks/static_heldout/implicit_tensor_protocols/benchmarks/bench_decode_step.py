"""Times the trtllm-gen decode kernel at a few batch sizes."""

import argparse
import time

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from protoserve.config import EngineConfig

WORKSPACE_BYTES = 128 << 20


def bench_trtllm_decode(bs: int, seq_len: int, iters: int = 50) -> float:
    cfg = EngineConfig()
    pages_per_req = (seq_len + cfg.page_size - 1) // cfg.page_size
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    kv = torch.randn(
        bs * pages_per_req, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.kv_dtype, device="cuda"
    )
    q = torch.randn(bs, cfg.num_attention_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    block_tables = torch.arange(bs * pages_per_req, dtype=torch.int32, device="cuda").view(bs, pages_per_req)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int32, device="cuda")

    def run():
        return trtllm_batch_decode_with_kv_cache(
            query=q, kv_cache=kv, workspace_buffer=ws, block_tables=block_tables, seq_lens=seq_lens,
            max_seq_len=seq_len, bmm1_scale=cfg.head_dim ** -0.5, bmm2_scale=1.0,
        )

    run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64, 128])
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args()
    for bs in args.batch_sizes:
        print(f"bs={bs}: trtllm decode {bench_trtllm_decode(bs, args.seq_len):.3f} ms")
