import triton
import triton.language as tl


@triton.jit
def fill_kv_indices_kernel(
    req_to_page_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    stride: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    n_pages = (tl.load(seq_lens_ptr + pid) + PAGE_SIZE - 1) // PAGE_SIZE
    start = tl.load(kv_indptr_ptr + pid)
    for off in range(0, n_pages, BLOCK):
        idx = off + tl.arange(0, BLOCK)
        mask = idx < n_pages
        page = tl.load(req_to_page_ptr + req * stride + idx, mask=mask)
        tl.store(kv_indices_ptr + start + idx, page, mask=mask)
