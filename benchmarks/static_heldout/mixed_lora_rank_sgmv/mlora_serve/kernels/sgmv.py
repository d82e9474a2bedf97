"""Segmented gather matrix-vector (SGMV) shrink / expand for LoRA with per-segment adapter slots."""
import torch
import triton
import triton.language as tl


@triton.jit
def sgmv_shrink_kernel(
    x_ptr, w_ptr, out_ptr, seg_indptr_ptr, widx_ptr,
    hidden, max_rank,
    stride_xm, stride_ws, stride_wr, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    assert BLOCK_R % 16 == 0  # ok: FC109
    seg = tl.program_id(0)
    pid_m = tl.program_id(1)
    start = tl.load(seg_indptr_ptr + seg)
    end = tl.load(seg_indptr_ptr + seg + 1)
    slot = tl.load(widx_ptr + seg)
    rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ranks = tl.arange(0, BLOCK_R)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k in range(0, hidden, BLOCK_K):
        cols = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=(rows[:, None] < end) & (cols[None, :] < hidden), other=0.0)
        w = tl.load(w_ptr + slot * stride_ws + ranks[None, :] * stride_wr + cols[:, None], mask=(ranks[None, :] < max_rank) & (cols[:, None] < hidden), other=0.0)
        acc += tl.dot(x, w)
    tl.store(out_ptr + rows[:, None] * stride_om + ranks[None, :], acc.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < end) & (ranks[None, :] < max_rank))


@triton.jit
def sgmv_expand_kernel(
    s_ptr, w_ptr, scal_ptr, y_ptr, seg_indptr_ptr, widx_ptr,
    hidden, max_rank,
    stride_sm, stride_ws, stride_wh, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):
    seg = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_n = tl.program_id(2)
    start = tl.load(seg_indptr_ptr + seg)
    end = tl.load(seg_indptr_ptr + seg + 1)
    slot = tl.load(widx_ptr + seg)
    scale = tl.load(scal_ptr + slot)
    rows = start + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ranks = tl.arange(0, BLOCK_R)
    s = tl.load(s_ptr + rows[:, None] * stride_sm + ranks[None, :], mask=(rows[:, None] < end) & (ranks[None, :] < max_rank), other=0.0)
    w = tl.load(w_ptr + slot * stride_ws + cols[None, :] * stride_wh + ranks[:, None], mask=(cols[None, :] < hidden) & (ranks[:, None] < max_rank), other=0.0)
    y_ptrs = y_ptr + rows[:, None] * stride_ym + cols[None, :]
    m = (rows[:, None] < end) & (cols[None, :] < hidden)
    y = tl.load(y_ptrs, mask=m, other=0.0)
    tl.store(y_ptrs, (y + scale * tl.dot(s, w)).to(y_ptr.dtype.element_ty), mask=m)


def sgmv_shrink(x: torch.Tensor, w: torch.Tensor, seg_indptr: torch.Tensor, weight_indices: torch.Tensor, out: torch.Tensor, max_m: int) -> None:
    nseg = weight_indices.shape[0]
    block_r = max(16, triton.next_power_of_2(out.shape[1]))
    grid = (nseg, triton.cdiv(max_m, 16))
    sgmv_shrink_kernel[grid](
        x, w, out, seg_indptr, weight_indices, x.shape[1], out.shape[1],
        x.stride(0), w.stride(0), w.stride(1), out.stride(0),
        BLOCK_M=16, BLOCK_R=block_r, BLOCK_K=64,
    )


def sgmv_expand(s: torch.Tensor, w: torch.Tensor, scalings: torch.Tensor, seg_indptr: torch.Tensor, weight_indices: torch.Tensor, y: torch.Tensor, max_m: int) -> None:
    nseg = weight_indices.shape[0]
    block_r = max(16, triton.next_power_of_2(s.shape[1]))
    grid = (nseg, triton.cdiv(max_m, 16), triton.cdiv(y.shape[1], 64))
    sgmv_expand_kernel[grid](
        s, w, scalings, y, seg_indptr, weight_indices, y.shape[1], s.shape[1],
        s.stride(0), w.stride(0), w.stride(1), y.stride(0),
        BLOCK_M=16, BLOCK_N=64, BLOCK_R=block_r,
    )
