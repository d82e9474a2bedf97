"""Small Triton kernels for multi-token expansions."""
import triton
import triton.language as tl


@triton.jit
def advance_lengths_kernel(last_page_len_ptr, lens_ptr, n, page_size, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    lens = tl.load(lens_ptr + offs, mask=mask, other=0) + 1
    tl.store(lens_ptr + offs, lens, mask=mask)
    tl.store(last_page_len_ptr + offs, (lens - 1) % page_size + 1, mask=mask)
