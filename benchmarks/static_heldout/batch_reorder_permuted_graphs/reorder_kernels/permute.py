import triton
import triton.language as tl


@triton.jit
def _permute_indices_kernel(src_ptr, src_indptr_ptr, dst_ptr, dst_indptr_ptr, perm_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    src_row = tl.load(perm_ptr + row)
    s0 = tl.load(src_indptr_ptr + src_row)
    s1 = tl.load(src_indptr_ptr + src_row + 1)
    d0 = tl.load(dst_indptr_ptr + row)
    n = s1 - s0
    for off in range(0, n, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(src_ptr + s0 + offs, mask=m)
        tl.store(dst_ptr + d0 + offs, v, mask=m)


def permute_page_indices(src, src_indptr, dst, dst_indptr, perm, bs):
    """dst row i <- src row perm[i]: the page lists of the batch in sorted order."""
    _permute_indices_kernel[(bs,)](src, src_indptr, dst, dst_indptr, perm, BLOCK=256)
