"""trtllm-gen decode against the FA2 decode wrapper on one small batch (needs a Blackwell GPU)."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_trtllm_matches_fa2():
    dev = torch.device("cuda")
    bs, h, hkv, d, page, pages_per = 4, 8, 2, 128, 16, 3
    kv = torch.randn(bs * pages_per + 1, 2, hkv, page, d, dtype=torch.float16, device=dev)
    q = torch.randn(bs, h, d, dtype=torch.float16, device=dev)
    table = torch.arange(1, bs * pages_per + 1, dtype=torch.int32, device=dev).view(bs, pages_per)
    seq_lens = torch.full((bs,), pages_per * page, dtype=torch.int32, device=dev)

    ref_ws = torch.zeros(64 << 20, dtype=torch.uint8, device=dev)
    ref = BatchDecodeWithPagedKVCacheWrapper(ref_ws, "HND")
    ref.plan(
        torch.arange(0, bs * pages_per + 1, pages_per, dtype=torch.int32),
        table.flatten(),
        torch.full((bs,), page, dtype=torch.int32),
        h, hkv, d, page,
        q_data_type=torch.float16,
        kv_data_type=torch.float16,
    )
    expected = ref.run(q, kv)

    workspace = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device=dev)  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(
        q, kv, workspace, table, seq_lens, pages_per * page, bmm1_scale=d**-0.5, bmm2_scale=1.0
    )
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
