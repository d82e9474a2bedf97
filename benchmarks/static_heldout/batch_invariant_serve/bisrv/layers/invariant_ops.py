"""Batch-invariant reductions: one program per row, the same reduction order for every batch size."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_row_kernel(x_ptr, w_ptr, out_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * stride + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_invariant(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    out = torch.empty_like(x)
    _rms_norm_row_kernel[(x.shape[0],)](x, weight, out, x.stride(0), x.shape[1], eps, BLOCK=1024)
    return out


def log_softmax_invariant(logits: torch.Tensor) -> torch.Tensor:
    # float32 and a single pass per row; torch's kernel picks a split by the batch size
    x = logits.float()
    m = x.amax(dim=-1, keepdim=True)
    return x - m - torch.log(torch.exp(x - m).sum(dim=-1, keepdim=True))
