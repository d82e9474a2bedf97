"""Triton kernel that applies a packed vocabulary bitmask to logits in place."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _apply_bitmask_kernel(logits_ptr, mask_ptr, vocab_size, logits_stride, mask_stride, BLOCK: tl.constexpr):
    assert BLOCK % 32 == 0  # ok: FC109
    row = tl.program_id(0)
    blk = tl.program_id(1)
    offs = blk * BLOCK + tl.arange(0, BLOCK)
    words = tl.load(mask_ptr + row * mask_stride + offs // 32, mask=offs < vocab_size, other=0)
    allowed = (words >> (offs % 32)) & 1
    ptrs = logits_ptr + row * logits_stride + offs
    vals = tl.load(ptrs, mask=offs < vocab_size, other=0.0)
    tl.store(ptrs, tl.where(allowed == 1, vals, float("-inf")), mask=offs < vocab_size)


def apply_token_bitmask_inplace(logits: torch.Tensor, mask: torch.Tensor, block: int = 1024) -> None:
    rows, vocab = logits.shape
    grid = (rows, triton.cdiv(vocab, block))
    _apply_bitmask_kernel[grid](logits, mask, vocab, logits.stride(0), mask.stride(0), BLOCK=block)


def load_bitmask_kernel():
    return _apply_bitmask_kernel
