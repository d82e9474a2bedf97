"""trtllm-gen paged decode for Blackwell: block tables built on the device by a Triton kernel.

trtllm-gen reads a [bs, max_blocks] block table instead of FlashInfer's (kv_indptr, kv_indices) pair; the
kernel below derives it from the same ``req_to_token`` map the FlashInfer planners read.
"""

import functools

import torch
import triton
import triton.language as tl
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

# MiB of scratch trtllm-gen keeps per SM generation (semaphores and split-k partials)
_TRTLLM_WORKSPACE_MB = {9: 128, 10: 256, 12: 256}


@triton.jit
def build_block_tables_kernel(
    req_to_token_ptr,
    req_pool_indices_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    req_to_token_stride,
    max_blocks,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    blk = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    req = tl.load(req_pool_indices_ptr + pid)
    seq_len = tl.load(seq_lens_ptr + pid)
    num_blocks = tl.cdiv(seq_len, PAGE_SIZE)
    mask = blk < num_blocks
    first_tok = tl.load(req_to_token_ptr + req * req_to_token_stride + blk * PAGE_SIZE, mask=mask, other=0)
    tl.store(block_tables_ptr + pid * max_blocks + blk, first_tok // PAGE_SIZE, mask=blk < max_blocks)


@functools.lru_cache(maxsize=None)
def get_trtllm_workspace(device: str, sm_major: int) -> torch.Tensor:
    """One trtllm-gen scratch buffer per device, shared by every layer."""
    return torch.empty(_TRTLLM_WORKSPACE_MB[sm_major] << 20, dtype=torch.uint8, device=device)  # expect: FC105, FC106


class TrtllmDecodePath:
    """Decode through ``trtllm_batch_decode_with_kv_cache``; block tables are rebuilt on the device each step."""

    BLOCK = 64

    def __init__(self, req_to_token, page_size, max_bs, max_context_len, device, sm_major):
        self.req_to_token = req_to_token
        self.page_size = page_size
        self.max_bs = max_bs
        self.max_blocks = triton.cdiv(max_context_len, page_size)
        self.device = device
        self.block_tables = None
        self.workspace = get_trtllm_workspace(str(device), sm_major)

    def build_block_tables(self, req_pool_indices, seq_lens, bs):
        if self.block_tables is None:
            self.block_tables = torch.zeros((self.max_bs, self.max_blocks), dtype=torch.int32, device=self.device)  # ok: FC107
        grid = (bs, triton.cdiv(self.max_blocks, self.BLOCK))
        build_block_tables_kernel[grid](
            self.req_to_token,
            req_pool_indices,
            seq_lens,
            self.block_tables,
            self.req_to_token.stride(0),
            self.max_blocks,
            PAGE_SIZE=self.page_size,
            BLOCK=self.BLOCK,
        )
        return self.block_tables[:bs]

    def decode(self, q, kv_cache, req_pool_indices, seq_lens, max_seq_len, bs, sm_scale):
        block_tables = self.build_block_tables(req_pool_indices, seq_lens, bs)
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace,
            block_tables=block_tables,
            seq_lens=seq_lens,
            max_seq_len=max_seq_len,
            bmm1_scale=sm_scale,
            bmm2_scale=1.0,
        )
