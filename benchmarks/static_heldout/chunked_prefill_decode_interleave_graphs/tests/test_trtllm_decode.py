"""Parity of the trtllm-gen decode used for long-context rows against the FA2 decode wrapper."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trtllm_matches_fa2_decode():
    torch.manual_seed(0)
    bs, heads, kv_heads, dim, page, pages_per_row = 4, 32, 8, 128, 16, 8
    kv = torch.randn(bs * pages_per_row, 2, page, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs, heads, dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(bs * pages_per_row, dtype=torch.int32, device="cuda").view(bs, pages_per_row)
    seq_lens = torch.full((bs,), page * pages_per_row, dtype=torch.int32, device="cuda")
    workspace = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(
        q, kv, workspace, block_tables, seq_lens, page * pages_per_row, bmm1_scale=dim**-0.5, bmm2_scale=1.0
    )
    ref_ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")
    ref = BatchDecodeWithPagedKVCacheWrapper(ref_ws, "NHD", use_tensor_cores=True)
    ref.plan(
        torch.arange(0, bs * pages_per_row + 1, pages_per_row, dtype=torch.int32),
        block_tables.flatten(),
        torch.full((bs,), page, dtype=torch.int32),
        heads,
        kv_heads,
        dim,
        page,
        q_data_type=torch.bfloat16,
    )
    torch.testing.assert_close(out, ref.run(q, kv), atol=2e-2, rtol=2e-2)
