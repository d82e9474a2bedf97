"""Gather a batch's token slots from ``req_to_token`` into a FlashInfer ``kv_indices`` buffer."""

import triton
import triton.language as tl


@triton.jit
def create_flashinfer_kv_indices_triton(
    req_to_token_ptr,
    req_pool_indices_ptr,
    kv_lens_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    req_to_token_stride: tl.constexpr,
    BLOCK: tl.constexpr = 512,
):
    row = tl.program_id(axis=0)
    slot = tl.load(req_pool_indices_ptr + row).to(tl.int64)
    out_start = tl.load(kv_indptr_ptr + row)
    n = tl.load(kv_lens_ptr + row).to(tl.int32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tok = tl.load(req_to_token_ptr + slot * req_to_token_stride + offs, mask=mask)
        tl.store(kv_indices_ptr + out_start + offs, tok, mask=mask)
