"""Triton kernel that gathers the pages inside each request's sliding window."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _window_indices_kernel(
    req_to_page_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    window_indptr_ptr,
    out_ptr,
    stride_req,
    page_size: tl.constexpr,
    window: tl.constexpr,
    max_window_pages: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    seq_len = tl.load(seq_lens_ptr + pid)
    start = tl.load(window_indptr_ptr + pid)
    num = tl.load(window_indptr_ptr + pid + 1) - start
    first_page = tl.maximum(seq_len - window, 0) // page_size
    for off in range(0, max_window_pages, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        mask = cols < num
        pages = tl.load(req_to_page_ptr + req * stride_req + first_page + cols, mask=mask)
        tl.store(out_ptr + start + cols, pages, mask=mask)


def fill_window_indices(
    out: torch.Tensor,
    req_to_page: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    window_indptr: torch.Tensor,
    page_size: int,
    window: int,
) -> None:
    bs = req_pool_indices.numel()
    max_window_pages = -(-window // page_size) + 1
    _window_indices_kernel[(bs,)](
        req_to_page,
        req_pool_indices,
        seq_lens,
        window_indptr,
        out,
        req_to_page.stride(0),
        page_size=page_size,
        window=window,
        max_window_pages=max_window_pages,
        BLOCK=64,
    )
