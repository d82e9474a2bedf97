"""Gather each row's window pages out of its ring, in logical order, into a CSR indices buffer."""

import triton
import triton.language as tl


@triton.jit
def gather_window_pages(
    ring_ptr,
    req_slots_ptr,
    first_page_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    ring_size,
    ring_stride,
    BLOCK: tl.constexpr,
):
    assert BLOCK % 32 == 0  # ok: FC109
    row = tl.program_id(0)
    slot = tl.load(req_slots_ptr + row)
    first = tl.load(first_page_ptr + row)
    start = tl.load(kv_indptr_ptr + row)
    n = tl.load(kv_indptr_ptr + row + 1) - start
    for off in range(0, n, BLOCK):
        j = off + tl.arange(0, BLOCK)
        mask = j < n
        page = tl.load(ring_ptr + slot * ring_stride + (first + j) % ring_size, mask=mask)
        tl.store(kv_indices_ptr + start + j, page, mask=mask)
