"""Triton kernels that build FlashInfer's paged-KV metadata on the device, and their launchers.

The launchers take the output buffer as a parameter and return the view they filled, so the attention backend
can point them at its persistent (CUDA-graph-bound) buffers, at per-step scratch or, for ``cumsum_indptr_``,
at pinned host mirrors alike.
"""

import torch
import triton
import triton.language as tl

from tkv_kernels.autotune_table import pick_index_block

# build_kv_indptr_kernel scans the whole batch in one program
_MAX_SCAN_BS = 4096


@triton.jit
def create_flashinfer_kv_indices_triton(
    req_to_token_ptr,  # [max_batch, max_context_len]
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_indptr,
    kv_start_idx,
    kv_indices_ptr,
    req_to_token_ptr_stride: tl.constexpr,
):
    BLOCK_SIZE: tl.constexpr = 512
    pid = tl.program_id(axis=0)

    req_pool_index = tl.load(req_pool_indices_ptr + pid)
    kv_indices_offset = tl.load(kv_indptr + pid)

    kv_start = 0
    kv_end = 0
    if kv_start_idx:  # ok: FC101
        kv_start = tl.load(kv_start_idx + pid).to(tl.int32)
        kv_end = kv_start
    kv_end += tl.load(page_kernel_lens_ptr + pid).to(tl.int32)

    num_loop = tl.cdiv(kv_end - kv_start, BLOCK_SIZE)
    for i in range(num_loop):  # ok: FC101
        offset = tl.arange(0, BLOCK_SIZE).to(tl.int64) + i * BLOCK_SIZE
        mask = offset < kv_end - kv_start
        data = tl.load(
            req_to_token_ptr + req_pool_index * req_to_token_ptr_stride + kv_start + offset,
            mask=mask,
        )
        tl.store(kv_indices_ptr + kv_indices_offset + offset, data, mask=mask)


@triton.jit
def build_kv_indptr_kernel(lens_ptr, kv_indptr_ptr, bs, BLOCK: tl.constexpr):
    """kv_indptr[i] = sum(lens[:i]) for i in [0, bs]; one program."""
    offs = tl.arange(0, BLOCK)
    lens = tl.load(lens_ptr + offs, mask=offs < bs, other=0).to(tl.int32)
    csum = tl.cumsum(lens, axis=0)
    tl.store(kv_indptr_ptr + offs, csum - lens, mask=offs < bs)
    tl.store(kv_indptr_ptr + bs, tl.sum(lens, axis=0))


@triton.jit
def pad_kv_indptr_kernel(kv_indptr_ptr, raw_bs, bs, BLOCK: tl.constexpr):
    """Make the padded rows raw_bs..bs-1 empty: kv_indptr[raw_bs + 1 : bs + 1] = kv_indptr[raw_bs]."""
    last = tl.load(kv_indptr_ptr + raw_bs)
    offs = raw_bs + 1 + tl.arange(0, BLOCK)
    tl.store(kv_indptr_ptr + offs, tl.zeros([BLOCK], dtype=tl.int32) + last, mask=offs <= bs)


@triton.jit
def fill_rows_kernel(buf_ptr, start, end, value, BLOCK: tl.constexpr):
    offs = start + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(buf_ptr + offs, tl.zeros([BLOCK], dtype=tl.int32) + value, mask=offs < end)


@triton.jit
def remap_page_ids_kernel(page_ids_ptr, remap_ptr, n, BLOCK: tl.constexpr):
    """page_ids[i] = remap[page_ids[i]] (after the KV pool moved pages)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    old = tl.load(page_ids_ptr + offs, mask=mask, other=0)
    new = tl.load(remap_ptr + old, mask=mask, other=0)
    tl.store(page_ids_ptr + offs, new.to(tl.int32), mask=mask)


def launch_create_kv_indices(req_to_token, req_pool_indices, paged_kernel_lens, kv_indptr, kv_start_idx, kv_indices, bs):
    """Gather each request's page ids into kv_indices[kv_indptr[i] : kv_indptr[i + 1]]; one program per request."""
    if kv_indptr.shape[0] < bs + 1:
        raise ValueError(f"kv_indptr holds {kv_indptr.shape[0]} rows, a batch of {bs} needs {bs + 1}")
    create_flashinfer_kv_indices_triton[(bs,)](
        req_to_token,
        req_pool_indices,
        paged_kernel_lens,
        kv_indptr,
        kv_start_idx,
        kv_indices,
        req_to_token.shape[1],
    )
    return kv_indices


def launch_build_kv_indptr(lens, kv_indptr, bs):
    """kv_indptr[: bs + 1] = [0, cumsum(lens[:bs])] with one launch; returns that view."""
    assert bs <= _MAX_SCAN_BS, "build_kv_indptr_kernel scans the batch in one program"  # expect: FC109
    build_kv_indptr_kernel[(1,)](lens, kv_indptr, bs, BLOCK=triton.next_power_of_2(max(bs, 16)))
    return kv_indptr[: bs + 1]


def cumsum_indptr_(lens, out, bs):
    """Exclusive prefix sum of lens[:bs] into out[: bs + 1] (out[0] stays 0); device buffers and pinned mirrors alike."""
    torch.cumsum(lens[:bs], dim=0, dtype=out.dtype, out=out[1 : bs + 1])
    return out[: bs + 1]


def fill_rows_(buf, start, end, value):
    """buf[start:end] = value with one small launch (the bounds never round-trip through the host)."""
    if end <= start:
        return buf
    fill_rows_kernel[(triton.cdiv(end - start, 128),)](buf, start, end, value, BLOCK=128)
    return buf


def remap_page_ids_(page_ids, remap, block_size=None):
    """Rewrite every page id in page_ids through remap, in place."""
    n = page_ids.numel()
    block = pick_index_block(n, block_size)
    grid = lambda META: (triton.cdiv(n, META["BLOCK"]),)
    remap_page_ids_kernel[grid](page_ids, remap, n, BLOCK=block)
    return page_ids
