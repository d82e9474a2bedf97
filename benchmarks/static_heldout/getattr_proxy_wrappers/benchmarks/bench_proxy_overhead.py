"""Proxy overhead on plan()+run(): python -m benchmarks.bench_proxy_overhead"""
import time

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from proxyserve import PAGE_SIZE, TracedWrapper


def main(iters: int = 200) -> None:
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    fa2_ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    for ws in (workspace, fa2_ws):
        proxy = TracedWrapper(BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa2"), "bench")
        qo = torch.arange(0, 8 * 512 + 1, 512, dtype=torch.int32, device="cuda")
        t0 = time.perf_counter()
        for _ in range(iters):
            proxy.plan(qo, qo, 32, 8, 128, causal=True)  # ok: FC102
        print(f"plan: {(time.perf_counter() - t0) / iters * 1e6:.1f} us, last qo {qo[-1].item()}")  # ok: FC101
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    q = torch.randn(8, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 8, PAGE_SIZE, 128, dtype=torch.bfloat16, device="cuda")
    tables, lens = torch.arange(8, dtype=torch.int32, device="cuda").view(8, 1), torch.full((8,), PAGE_SIZE, device="cuda")
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, w, tables, lens, PAGE_SIZE, 128 ** -0.5, 1.0) for w in (fresh, zeroed)]
    assert torch.allclose(outs[0], outs[1]), "trtllm-gen decode depends on the workspace contents"  # ok: FC109
    print("max diff", (outs[0] - outs[1]).abs().max().cpu())  # ok: FC101


if __name__ == "__main__":
    main()
