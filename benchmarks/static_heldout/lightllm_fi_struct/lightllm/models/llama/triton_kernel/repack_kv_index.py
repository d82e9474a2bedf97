import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_kernel_repack_kv_index(
    req_to_token, req_index, out_kv_index, seq_len, start_loc, stride_req, BLOCK: tl.constexpr
):
    cur_batch = tl.program_id(0)
    block = tl.program_id(1)
    offs = block * BLOCK + tl.arange(0, BLOCK)
    cur_len = tl.load(seq_len + cur_batch)
    cur_req = tl.load(req_index + cur_batch)
    cur_start = tl.load(start_loc + cur_batch)
    mask = offs < cur_len
    vals = tl.load(req_to_token + stride_req * cur_req + offs, mask=mask)
    tl.store(out_kv_index + cur_start + offs, vals, mask=mask)


def repack_kv_index(req_to_token, b_req_idx, b_seq_len, b_start_loc, max_len, out_kv_index):
    batch = b_seq_len.shape[0]
    BLOCK = 64
    grid = (batch, triton.cdiv(max_len, BLOCK))
    _fwd_kernel_repack_kv_index[grid](
        req_to_token, b_req_idx, out_kv_index, b_seq_len, b_start_loc, req_to_token.stride(0), BLOCK=BLOCK
    )
    return out_kv_index
