"""Vision attention microbenchmark: packed native-resolution images through the ragged prefill backends.

    python benchmarks/bench_vision_encoder.py --images 8 --side 448
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

from navit.config import VLMConfig
from navit.packing import pack_images
from nv_vision.encoder import VisionEncoder


def bench_ragged(args: argparse.Namespace) -> float:
    cfg = VLMConfig()
    packed = pack_images([np.random.rand(args.side, args.side, 3).astype(np.float32) for _ in range(args.images)], torch.device("cuda"))
    fa2_ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    cudnn_ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    fa2 = BatchPrefillWithRaggedKVCacheWrapper(fa2_ws, "NHD")
    cudnn = BatchPrefillWithRaggedKVCacheWrapper(cudnn_ws, "NHD", backend="cudnn")
    fa2.plan(packed.cu_seqlens, packed.cu_seqlens, cfg.vision_heads, cfg.vision_heads, cfg.vision_head_dim, causal=False)  # ok: FC102
    cudnn.plan(packed.cu_seqlens_cpu, packed.cu_seqlens_cpu, cfg.vision_heads, cfg.vision_heads, cfg.vision_head_dim, causal=False)
    q, k, v = torch.randn(3, packed.num_patches, cfg.vision_heads, cfg.vision_head_dim, dtype=torch.bfloat16, device="cuda")
    ref = cudnn.run(q, k, v)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        out = fa2.run(q, k, v)  # ok: FC108
    torch.cuda.synchronize()
    err = (out - ref).abs().max().item()  # ok: FC101
    assert err < 5e-2, f"fa2 and cudnn disagree by {err}"  # ok: FC109
    return (time.perf_counter() - t0) / args.iters * 1e3


def bench_decode_backends(args: argparse.Namespace) -> None:
    cfg = VLMConfig()
    fa2 = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(256 << 20, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC106
    trt_ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    trt = BatchDecodeWithPagedKVCacheWrapper(trt_ws, "NHD", backend="trtllm-gen")
    zeroed_ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    zeroed_ws.zero_()
    trt_zeroed = BatchDecodeWithPagedKVCacheWrapper(zeroed_ws, "NHD", backend="trtllm-gen")
    bs, pages = args.images, 64
    indptr = torch.arange(bs + 1, dtype=torch.int32) * pages
    last = torch.full((bs,), 7, dtype=torch.int32)
    kv = torch.randn(bs * pages, 2, 16, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs, cfg.num_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    outs = []
    for w in (fa2, trt, trt_zeroed):
        w.plan(indptr, torch.arange(bs * pages, dtype=torch.int32, device="cuda"), last, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 16)
        outs.append(w.run(q, kv))
    assert all(torch.allclose(outs[0], o, atol=5e-2) for o in outs[1:])  # ok: FC109


def bench_encoder(args: argparse.Namespace) -> float:
    enc = VisionEncoder(VLMConfig(), torch.device("cuda")).cuda().bfloat16()
    images = [np.random.rand(args.side, args.side + 28 * i, 3).astype(np.float32) for i in range(args.images)]
    packed = pack_images(images, torch.device("cuda"))
    packed.patches = packed.patches.bfloat16()
    t0 = time.perf_counter()
    out = enc(packed)
    torch.cuda.synchronize()
    assert out.shape[0] == int(packed.tokens_per_image_cpu.sum())  # ok: FC109
    return (time.perf_counter() - t0) * 1e3


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--side", type=int, default=448)
    parser.add_argument("--iters", type=int, default=50)
    a = parser.parse_args()
    print(f"ragged fa2: {bench_ragged(a):.3f} ms/iter, encoder: {bench_encoder(a):.1f} ms")
    bench_decode_backends(a)
