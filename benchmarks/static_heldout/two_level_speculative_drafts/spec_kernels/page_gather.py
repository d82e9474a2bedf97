"""Triton kernel writing each row's page ids into a flat indices buffer at its indptr offset."""

import triton
import triton.language as tl


@triton.jit
def gather_page_ids_kernel(out_indices_ptr, page_table_ptr, indptr_ptr, pt_stride, BLOCK: tl.constexpr):
    assert BLOCK % 32 == 0  # ok: FC109
    row = tl.program_id(0)
    start = tl.load(indptr_ptr + row)
    end = tl.load(indptr_ptr + row + 1)
    n = end - start
    for off in range(0, n, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        m = idx < n
        pages = tl.load(page_table_ptr + row * pt_stride + idx, mask=m)
        tl.store(out_indices_ptr + start + idx, pages, mask=m)
