"""Times the eager decode Function against a replayed graph at a fixed batch."""

import time

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from agserve.config import EngineConfig
from agserve.ops.attention_fn import PagedDecodeAttention, PlanDecodeFn

BENCH_WORKSPACE = 256 * 1024 * 1024


def bench_eager_decode(bs: int = 64, iters: int = 100) -> float:
    cfg = EngineConfig(num_layers=1, mla_layers=())
    workspace = torch.zeros(BENCH_WORKSPACE, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=True)
    pages = 8
    indptr_host = torch.arange(0, (bs + 1) * pages, pages, dtype=torch.int32)
    last_host = torch.full((bs,), cfg.page_size, dtype=torch.int32)
    indices = torch.arange(bs * pages, dtype=torch.int32, device="cuda")
    PlanDecodeFn.apply(w, indptr_host, indices, last_host, cfg)
    k = torch.randn(bs * pages, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    seq_lens = torch.full((bs,), pages * cfg.page_size, dtype=torch.int32, device="cuda")
    for _ in range(5):
        PagedDecodeAttention.apply(q, k, k, w, seq_lens)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        PagedDecodeAttention.apply(q, k, k, w, seq_lens)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e6


if __name__ == "__main__":
    print(f"eager decode: {bench_eager_decode():.1f} us/step")
