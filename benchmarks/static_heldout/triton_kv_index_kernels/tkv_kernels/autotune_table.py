"""Autotune configuration table for the blocked kv-indices kernel.

Rows are (upper bound on the longest request in the batch, BLOCK_SIZE, num_warps). ``triton.autotune``
benchmarks every row the first time it sees a new ``max_len_bucket``; ``pick_index_block`` reads the same table
for the launchers that pick a block size themselves (the page-id remap).
"""

import triton
import triton.language as tl

_INDEX_BLOCK_TABLE = (
    (256, 128, 2),
    (2048, 256, 4),
    (16384, 512, 4),
    (1 << 30, 1024, 8),
)

assert all(block & (block - 1) == 0 for _, block, _ in _INDEX_BLOCK_TABLE)  # ok: FC109

INDEX_KERNEL_CONFIGS = [
    triton.Config({"BLOCK_SIZE": block}, num_warps=warps) for _, block, warps in _INDEX_BLOCK_TABLE
]


def _check_block(block_size):
    assert block_size > 0 and block_size & (block_size - 1) == 0, "BLOCK must be a power of two"  # expect: FC109


def pick_index_block(max_len, block_size=None):
    """Block size for a launcher: the caller's choice if given, else the first table row that covers max_len."""
    if block_size is not None:
        _check_block(block_size)
        return block_size
    for bound, block, _ in _INDEX_BLOCK_TABLE:
        if max_len <= bound:
            return block
    return _INDEX_BLOCK_TABLE[-1][1]


def max_len_bucket(max_len):
    """Autotune key: the table row a length falls in, so the tuner runs once per row and not once per length."""
    for i, (bound, _, _) in enumerate(_INDEX_BLOCK_TABLE):
        if max_len <= bound:
            return i
    return len(_INDEX_BLOCK_TABLE) - 1


@triton.autotune(configs=INDEX_KERNEL_CONFIGS, key=["max_len_bucket"])
@triton.jit
def create_kv_indices_blocked_kernel(
    req_to_token_ptr,
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    max_len_bucket,
    req_to_token_stride: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Grid (bs, cdiv(longest, BLOCK_SIZE)): program (r, b) copies block b of request r's page ids."""
    assert BLOCK_SIZE >= 64, "BLOCK_SIZE below the smallest table row"  # ok: FC109
    pid_req = tl.program_id(0)
    pid_blk = tl.program_id(1)
    req = tl.load(req_pool_indices_ptr + pid_req)
    seq_len = tl.load(page_kernel_lens_ptr + pid_req)
    out_start = tl.load(kv_indptr_ptr + pid_req)
    offs = pid_blk * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < seq_len
    data = tl.load(req_to_token_ptr + req * req_to_token_stride + offs, mask=mask)
    tl.store(kv_indices_ptr + out_start + offs, data, mask=mask)
