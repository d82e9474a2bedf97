from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def slide_window_kernel(
    indices_ptr,
    indptr_ptr,
    page_table_ptr,
    seq_lens_ptr,
    pt_stride,
    PAGE: tl.constexpr,
    WIN_PAGES: tl.constexpr,
):
    """Rewrite row b's window page ids for its next token: the last WIN_PAGES pages."""
    b = tl.program_id(0)
    start = tl.load(indptr_ptr + b)
    seq = tl.load(seq_lens_ptr + b) + 1
    last_page = (seq - 1) // PAGE
    first = tl.maximum(last_page - WIN_PAGES + 1, 0)
    offs = tl.arange(0, WIN_PAGES)
    src = first + offs
    m = src <= last_page
    pages = tl.load(page_table_ptr + b * pt_stride + src, mask=m, other=0)
    tl.store(indices_ptr + start + offs, pages, mask=m)
