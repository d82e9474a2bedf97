"""Micro-benchmarks of the cross-attention kernels and the encoder prefill."""

import torch
from flashinfer import BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from t5serve import T5Config

BENCH_WS = 128 * 1024 * 1024


def _timed(fn, iters: int) -> torch.Tensor:
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return torch.tensor(times, device="cuda")


def bench_trtllm_cross(cfg: T5Config, bs: int = 32, enc_len: int = 1024, iters: int = 50) -> float:
    assert bs <= cfg.max_batch, "bench batch beyond the engine's max_batch"  # ok: FC109
    pages = enc_len // cfg.page_size
    ws = torch.empty(cfg.long_cross_workspace_bytes(), dtype=torch.uint8, device="cuda")  # expect: FC105
    kv = torch.randn(bs * pages, 2, cfg.num_heads, cfg.page_size, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    q = torch.randn(bs, cfg.num_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    tables = torch.arange(bs * pages, dtype=torch.int32, device="cuda").view(bs, pages)
    seq_lens = torch.full((bs,), enc_len, dtype=torch.int32, device="cuda")
    trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, seq_lens, enc_len, 1.0, 1.0)
    lat = _timed(lambda: trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, seq_lens, enc_len, 1.0, 1.0), iters)
    return lat.mean().item()  # ok: FC101


def bench_encoder_prefill(cfg: T5Config, n: int = 8, t: int = 512, iters: int = 20) -> float:
    ws = torch.zeros(BENCH_WS, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend="fa2")
    cu = torch.arange(n + 1, dtype=torch.int32) * t
    w.plan(cu, cu, cfg.num_heads, cfg.num_heads, cfg.head_dim, causal=False, sm_scale=1.0, q_data_type=cfg.dtype)
    q = torch.randn(n * t, cfg.num_heads, cfg.head_dim, dtype=cfg.dtype, device="cuda")
    return float(_timed(lambda: w.run(q, q, q), iters).median())

