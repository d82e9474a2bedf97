"""T5 relative-position buckets, the decoder bias rows read by the attention variant, and a page-table kernel."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


def relative_position_bucket(rel: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    ret = torch.zeros_like(rel)
    n = num_buckets
    if bidirectional:
        n //= 2
        ret += (rel > 0).long() * n
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = n // 2
    large = max_exact + (torch.log(rel.float() / max_exact + 1e-6) / math.log(max_distance / max_exact) * (n - max_exact)).long()
    large = torch.clamp(large, max=n - 1)
    return ret + torch.where(rel < max_exact, rel, large)


@triton.jit
def fill_pages_kernel(req_to_page_ptr, req_pool_indices_ptr, kv_indptr_ptr, kv_indices_ptr, stride: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + row)
    start = tl.load(kv_indptr_ptr + row)
    n = tl.load(kv_indptr_ptr + row + 1) - start
    for off in range(0, n, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        tl.store(kv_indices_ptr + start + offs, tl.load(req_to_page_ptr + req * stride + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _decoder_bias_kernel(
    bias_ptr, table_ptr, bucket_ptr, kv_tok_indptr_ptr, q_pos_ptr, NUM_HEADS: tl.constexpr, NUM_BUCKETS: tl.constexpr, BLOCK: tl.constexpr
):
    assert NUM_HEADS <= 64  # ok: FC109
    row = tl.program_id(0)
    start = tl.load(kv_tok_indptr_ptr + row)
    n = tl.load(kv_tok_indptr_ptr + row + 1) - start
    q_pos = tl.load(q_pos_ptr + row)
    for off in range(0, n, BLOCK):
        kv = off + tl.arange(0, BLOCK)
        mask = kv < n
        bucket = tl.load(bucket_ptr + (q_pos - kv), mask=mask, other=0)
        for h in tl.static_range(NUM_HEADS):
            val = tl.load(table_ptr + h * NUM_BUCKETS + bucket, mask=mask)
            tl.store(bias_ptr + (start + kv) * NUM_HEADS + h, val, mask=mask)


class RelBiasTable:
    """A learned [num_heads, num_buckets] table; the decoder's bias rows are gathered from it before each step."""

    def __init__(self, num_buckets: int, max_distance: int, num_heads: int, max_len: int, bidirectional: bool, device: torch.device):
        assert num_buckets % 2 == 0, "T5 splits its buckets between the two directions"  # expect: FC109
        self.num_buckets = num_buckets
        self.num_heads = num_heads
        self.table = torch.zeros(num_heads, num_buckets, dtype=torch.float32, device=device)
        rel = torch.arange(-max_len + 1, max_len, device=device) if bidirectional else -torch.arange(max_len, device=device)
        self.bucket_lut = relative_position_bucket(rel, bidirectional, num_buckets, max_distance).to(torch.int32)

    def load(self, weight: torch.Tensor) -> None:
        """weight: the checkpoint's nn.Embedding(num_buckets, num_heads) weight."""
        self.table.copy_(weight.t())

    def fill_decoder_rows(self, out: torch.Tensor, kv_tok_indptr: torch.Tensor, q_pos: torch.Tensor, bs: int) -> None:
        rows = out[: kv_tok_indptr[bs]]  # expect: FC101
        _decoder_bias_kernel[(bs,)](
            rows, self.table, self.bucket_lut, kv_tok_indptr, q_pos, NUM_HEADS=self.num_heads, NUM_BUCKETS=self.num_buckets, BLOCK=128
        )
