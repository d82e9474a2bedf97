"""Segment reductions over step tags (namespace package: no __init__.py)."""

import torch
import triton
import triton.language as tl


@triton.jit
def _segment_softmax_kernel(logits_ptr, out_ptr, seg_indptr_ptr, n_labels: tl.constexpr,
                            BLOCK: tl.constexpr):
    seg = tl.program_id(0)
    start = tl.load(seg_indptr_ptr + seg)
    end = tl.load(seg_indptr_ptr + seg + 1)
    assert BLOCK >= n_labels  # ok: FC109
    offs = tl.arange(0, BLOCK)
    for row in range(start, end):
        x = tl.load(logits_ptr + row * n_labels + offs, mask=offs < n_labels, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        tl.store(out_ptr + row * n_labels + offs, e / tl.sum(e, axis=0), mask=offs < n_labels)


def segment_softmax(logits: torch.Tensor, seg_indptr: torch.Tensor, num_segments: int) -> torch.Tensor:
    out = torch.empty_like(logits, dtype=torch.float32)
    n_labels = logits.shape[-1]
    _segment_softmax_kernel[(num_segments,)](logits, out, seg_indptr, n_labels, BLOCK=triton.next_power_of_2(n_labels))
    return out
