"""Triton kernels for the decode step (namespace package: no __init__.py)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _advance_last_page_len_kernel(last_page_len_ptr, seq_lens_ptr, n, page_size: tl.constexpr,
                                  BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    seq = tl.load(seq_lens_ptr + offs, mask=mask, other=0) + 1
    tl.store(seq_lens_ptr + offs, seq, mask=mask)
    tl.store(last_page_len_ptr + offs, (seq - 1) % page_size + 1, mask=mask)


def advance_decode_state(last_page_len: torch.Tensor, seq_lens: torch.Tensor, n: int, page_size: int) -> None:
    """Advance seq_lens and last_page_len by one token on the device."""
    block = 128
    _advance_last_page_len_kernel[(triton.cdiv(n, block),)](last_page_len, seq_lens, n, page_size, BLOCK=block)
