from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def create_kv_indices(req_to_token_ptr, req_pool_indices_ptr, kv_indptr_ptr, kv_indices_ptr, stride,
                      BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    end = tl.load(kv_indptr_ptr + pid + 1)
    for off in range(0, end - start, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        mask = offs < end - start
        tok = tl.load(req_to_token_ptr + req * stride + offs, mask=mask)
        tl.store(kv_indices_ptr + start + offs, tok, mask=mask)


@triton.jit
def remap_indices_kernel(indices_ptr, remap_ptr, n, BLOCK: tl.constexpr):
    assert BLOCK % 128 == 0  # ok: FC109
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    old = tl.load(indices_ptr + offs, mask=mask)
    tl.store(indices_ptr + offs, tl.load(remap_ptr + old, mask=mask), mask=mask)
