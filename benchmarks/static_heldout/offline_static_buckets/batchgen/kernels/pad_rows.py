"""Triton kernel that writes padding rows' page tables to the null page."""
import triton
import triton.language as tl


@triton.jit
def fill_null_rows_kernel(indices_ptr, indptr_ptr, first_pad_row, num_rows, BLOCK: tl.constexpr):
    assert BLOCK % 32 == 0  # ok: FC109
    row = tl.program_id(0) + first_pad_row
    if row < num_rows:
        start = tl.load(indptr_ptr + row)
        end = tl.load(indptr_ptr + row + 1)
        offs = start + tl.arange(0, BLOCK)
        tl.store(indices_ptr + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < end)
