"""Triton kernels that build decode page lists from the reservation table on the device."""

import triton
import triton.language as tl


@triton.jit
def _build_rows_kernel(page_table_ptr, slots_ptr, counts_ptr, indptr_ptr, indices_ptr, n_rows, n_pad,
                       table_stride, BLOCK: tl.constexpr):
    assert BLOCK % 32 == 0  # ok: FC109
    acc = 0
    tl.store(indptr_ptr, 0)
    for r in range(0, n_rows):
        slot = tl.load(slots_ptr + r)
        cnt = tl.load(counts_ptr + r)
        for start in range(0, cnt, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < cnt
            pages = tl.load(page_table_ptr + slot * table_stride + offs, mask=m)
            tl.store(indices_ptr + acc + offs, pages, mask=m)
        acc += cnt
        tl.store(indptr_ptr + r + 1, acc)
    for r in range(n_rows, n_pad):
        tl.store(indptr_ptr + r + 1, acc)


@triton.jit
def _remap_pages_kernel(indices_ptr, remap_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    page = tl.load(indices_ptr + offs, mask=m)
    new_page = tl.load(remap_ptr + page, mask=m)
    tl.store(indices_ptr + offs, new_page, mask=m)
