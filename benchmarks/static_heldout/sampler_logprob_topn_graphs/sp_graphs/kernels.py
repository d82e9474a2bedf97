"""Small Triton kernels of the decode loop."""

import triton
import triton.language as tl


@triton.jit
def advance_last_page_kernel(last_page_len_ptr, page_size, n, BLOCK: tl.constexpr):
    """Each row appended one token: its last page grows by one or a new page starts."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    cur = tl.load(last_page_len_ptr + offs, mask=mask, other=0)
    nxt = tl.where(cur == page_size, 1, cur + 1)
    tl.store(last_page_len_ptr + offs, nxt, mask=mask)


def grid_for(n: int, block: int = 256):
    return (triton.cdiv(n, block),)
