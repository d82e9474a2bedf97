"""On-GPU advance step for multi-step decoding (what vLLM's ``advance_step_flashinfer`` does in CUDA).

Step k+1 of a multi-step run reads the token sampled at step k. The kernels write it into the input
tokens, bump positions and sequence lengths, recompute slot mapping and last-page lengths, and rebuild
the paged-KV indptr/indices from the block tables, all without leaving the device.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _advance_tokens_kernel(
    input_tokens_ptr,
    sampled_ptr,
    positions_ptr,
    seq_lens_ptr,
    slot_mapping_ptr,
    block_tables_ptr,
    block_tables_stride,
    last_page_len_ptr,
    block_table_bound_ptr,
    block_size: tl.constexpr,
):
    row = tl.program_id(0)
    tok = tl.load(sampled_ptr + row)
    tl.store(input_tokens_ptr + row, tok)
    pos = tl.load(seq_lens_ptr + row)
    tl.store(positions_ptr + row, pos)
    tl.store(seq_lens_ptr + row, pos + 1)
    block_idx = pos // block_size
    block = tl.load(block_tables_ptr + row * block_tables_stride + block_idx)
    tl.store(slot_mapping_ptr + row, block * block_size + pos % block_size)
    tl.store(last_page_len_ptr + row, pos % block_size + 1)
    tl.store(block_table_bound_ptr + row, block_idx + 1)


@triton.jit
def _rebuild_indptr_kernel(kv_indptr_ptr, block_table_bound_ptr, num_rows, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    bounds = tl.load(block_table_bound_ptr + offs, mask=offs < num_rows, other=0)
    csum = tl.cumsum(bounds, axis=0)
    tl.store(kv_indptr_ptr + 1 + offs, csum, mask=offs < num_rows)


@triton.jit
def _rebuild_indices_kernel(
    kv_indices_ptr,
    kv_indptr_ptr,
    block_tables_ptr,
    block_tables_stride,
    block_table_bound_ptr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    start = tl.load(kv_indptr_ptr + row)
    n = tl.load(block_table_bound_ptr + row)
    for off in range(0, n, BLOCK):
        cols = off + tl.arange(0, BLOCK)
        blocks = tl.load(block_tables_ptr + row * block_tables_stride + cols, mask=cols < n, other=0)
        tl.store(kv_indices_ptr + start + cols, blocks, mask=cols < n)


def advance_step_flashinfer(
    *,
    num_seqs: int,
    num_queries: int,
    block_size: int,
    input_tokens,
    sampled_token_ids,
    input_positions,
    seq_lens,
    slot_mapping,
    block_tables,
    paged_kv_indices,
    paged_kv_indptr,
    paged_kv_last_page_len,
    block_table_bound,
) -> None:
    stride = block_tables.stride(0)
    _advance_tokens_kernel[(num_queries,)](
        input_tokens,
        sampled_token_ids,
        input_positions,
        seq_lens,
        slot_mapping,
        block_tables,
        stride,
        paged_kv_last_page_len,
        block_table_bound,
        block_size=block_size,
    )
    _rebuild_indptr_kernel[(1,)](paged_kv_indptr, block_table_bound, num_queries, BLOCK=triton.next_power_of_2(num_seqs))
    _rebuild_indices_kernel[(num_queries,)](
        paged_kv_indices, paged_kv_indptr, block_tables, stride, block_table_bound, BLOCK=128
    )
