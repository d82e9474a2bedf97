import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _trtllm_workspace() -> torch.Tensor:
    ws = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    return ws


def _paged(num_pages=8, page_size=16, kv_heads=8, head_dim=128):
    return torch.randn(num_pages, 2, page_size, kv_heads, head_dim, dtype=torch.bfloat16, device="cuda")


def test_cross_decode_fa2_matches_trtllm():
    kv = _paged()
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    indptr = torch.tensor([0, 3, 8], dtype=torch.int32)
    indices = torch.arange(8, dtype=torch.int32, device="cuda")
    last = torch.tensor([5, 16], dtype=torch.int32)

    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", backend="fa2")
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.bfloat16)
    ref = w.run(q, kv)

    block_tables = torch.tensor([[0, 1, 2, 0, 0], [3, 4, 5, 6, 7]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([37, 80], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        q, kv, _trtllm_workspace(), block_tables, seq_lens, 80, bmm1_scale=128 ** -0.5, bmm2_scale=1.0
    )
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
