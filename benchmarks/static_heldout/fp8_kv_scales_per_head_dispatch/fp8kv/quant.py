"""Quantise-on-write: bf16 K/V rows to FP8 pages with one scale per kv head."""

import torch
import triton
import triton.language as tl

from fp8kv.config import FP8_E4M3_MAX


@triton.jit
def quant_store_kernel(
    src_ptr,
    scale_ptr,
    amax_ptr,
    cache_ptr,
    slot_ptr,
    num_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    FP8_MAX: tl.constexpr,
):
    assert BLOCK_D >= HEAD_DIM  # ok: FC109
    tok = tl.program_id(0)
    head = tl.program_id(1)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < HEAD_DIM
    x = tl.load(src_ptr + (tok * num_heads + head) * HEAD_DIM + offs, mask=mask, other=0.0).to(tl.float32)
    # running amax per head for the tracker; the scale itself changes only between steps
    tl.atomic_max(amax_ptr + head, tl.max(tl.abs(x), axis=0))
    scale = tl.load(scale_ptr + head)
    q = tl.clamp(x / scale, -FP8_MAX, FP8_MAX)
    slot = tl.load(slot_ptr + tok)
    tl.store(cache_ptr + (slot * num_heads + head) * HEAD_DIM + offs, q.to(cache_ptr.dtype.element_ty), mask=mask)


def quantize_kv_write(
    x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, cache_flat: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """x: [tokens, kv_heads, head_dim] bf16; scale, amax: [kv_heads] fp32; cache_flat: [slots, kv_heads, head_dim]."""
    tokens, heads, head_dim = x.shape
    quant_store_kernel[(tokens, heads)](
        x,
        scale,
        amax,
        cache_flat,
        slot_mapping,
        heads,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        FP8_MAX=FP8_E4M3_MAX,
    )
