"""Triton kernels: quantize-on-append and INT4 page dequantization into staging pages."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dequant_int4_pages_kernel(
    packed_ptr,  # [num_pages, 2, PAGE_SIZE, KV_HEADS, HEAD_DIM // 2] uint8, two nibbles per byte
    k_scale_ptr,  # [nnz, KV_HEADS, HEAD_DIM // GROUP] fp16, gathered for this step's pages
    v_scale_ptr,
    src_page_ptr,  # [nnz] int32: pool page behind every listed page
    slot_ptr,  # [nnz] int32: staging slot of every listed page (the decode kv_indices)
    indptr_ptr,  # [bs + 1] int32: the decode kv_indptr; indptr[BS] is this step's nnz
    bs,
    staging_ptr,  # [staging_pages, 2, PAGE_SIZE, KV_HEADS, HEAD_DIM] bf16
    PAGE_SIZE: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    PAGES_PER_PROGRAM: tl.constexpr,
):
    assert HEAD_DIM % GROUP == 0  # ok: FC109
    pid = tl.program_id(0)
    kv = tl.program_id(1)
    nnz = tl.load(indptr_ptr + bs)
    offs_tok = tl.arange(0, PAGE_SIZE)
    offs_d = tl.arange(0, HEAD_DIM // 2)
    for i in range(PAGES_PER_PROGRAM):
        j = pid * PAGES_PER_PROGRAM + i
        if j < nnz:
            src = tl.load(src_page_ptr + j)
            dst = tl.load(slot_ptr + j)
            for h in range(KV_HEADS):
                base = ((src * 2 + kv) * PAGE_SIZE * KV_HEADS + h) * (HEAD_DIM // 2)
                packed = tl.load(packed_ptr + base + offs_tok[:, None] * KV_HEADS * (HEAD_DIM // 2) + offs_d[None, :])
                lo = (packed & 0xF).to(tl.int8) - 8
                hi = (packed >> 4).to(tl.int8) - 8
                g = (offs_d * 2) // GROUP
                if kv == 0:
                    scale = tl.load(k_scale_ptr + (j * KV_HEADS + h) * (HEAD_DIM // GROUP) + g)
                else:
                    scale = tl.load(v_scale_ptr + (j * KV_HEADS + h) * (HEAD_DIM // GROUP) + g)
                out_base = ((dst * 2 + kv) * PAGE_SIZE * KV_HEADS + h) * HEAD_DIM
                row = offs_tok[:, None] * KV_HEADS * HEAD_DIM
                tl.store(staging_ptr + out_base + row + offs_d[None, :] * 2, (lo.to(tl.float32) * scale[None, :]).to(tl.bfloat16))
                tl.store(staging_ptr + out_base + row + offs_d[None, :] * 2 + 1, (hi.to(tl.float32) * scale[None, :]).to(tl.bfloat16))


@triton.jit
def quantize_append_kernel(
    k_ptr,
    v_ptr,  # [bs, KV_HEADS, HEAD_DIM] bf16: this step's new token per row
    slot_ptr,  # [bs] int64: pool slot (page * PAGE_SIZE + offset) of each new token
    k_scale_ptr,  # [num_pages, KV_HEADS, HEAD_DIM // GROUP] of this layer
    v_scale_ptr,
    packed_ptr,
    amax_ptr,  # [bs] fp32 out: absmax of each row's new token
    PAGE_SIZE: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
):
    row = tl.program_id(0)
    slot = tl.load(slot_ptr + row)
    page = slot // PAGE_SIZE
    off = slot % PAGE_SIZE
    offs_d = tl.arange(0, HEAD_DIM // 2)
    amax = 0.0
    for h in range(KV_HEADS):
        k_lo = tl.load(k_ptr + (row * KV_HEADS + h) * HEAD_DIM + offs_d * 2).to(tl.float32)
        k_hi = tl.load(k_ptr + (row * KV_HEADS + h) * HEAD_DIM + offs_d * 2 + 1).to(tl.float32)
        g = (offs_d * 2) // GROUP
        ks = tl.load(k_scale_ptr + (page * KV_HEADS + h) * (HEAD_DIM // GROUP) + g).to(tl.float32)
        q_lo = tl.minimum(tl.maximum(k_lo / ks + 8.0, 0.0), 15.0).to(tl.uint8)
        q_hi = tl.minimum(tl.maximum(k_hi / ks + 8.0, 0.0), 15.0).to(tl.uint8)
        base = ((page * 2) * PAGE_SIZE + off) * KV_HEADS * (HEAD_DIM // 2) + h * (HEAD_DIM // 2)
        tl.store(packed_ptr + base + offs_d, q_lo | (q_hi << 4))
        amax = tl.maximum(amax, tl.max(tl.maximum(tl.abs(k_lo), tl.abs(k_hi)), axis=0))
    tl.store(amax_ptr + row, amax)
