"""GPU tests of the Triton index kernels against a torch reference, and a trtllm-gen decode smoke test."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from tkv_kernels.index_kernels import cumsum_indptr_, launch_build_kv_indptr, launch_create_kv_indices

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _reference_kv_indices(req_to_token, req_pool_indices, seq_lens):
    rows = [req_to_token[r, :n] for r, n in zip(req_pool_indices.tolist(), seq_lens.tolist())]
    return torch.cat(rows)


def test_kv_indices_match_reference():
    req_to_token = torch.arange(8 * 64, dtype=torch.int32, device="cuda").view(8, 64)
    req_pool_indices = torch.tensor([3, 0, 5], dtype=torch.int64, device="cuda")
    seq_lens = torch.tensor([17, 1, 64], dtype=torch.int32, device="cuda")
    kv_indptr = torch.zeros(4, dtype=torch.int32, device="cuda")
    launch_build_kv_indptr(seq_lens, kv_indptr, 3)
    kv_indices = torch.empty(82, dtype=torch.int32, device="cuda")
    launch_create_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices, 3)
    assert kv_indptr[-1].item() == 82  # ok: FC101
    assert torch.equal(kv_indices, _reference_kv_indices(req_to_token, req_pool_indices, seq_lens))  # ok: FC109


def test_cumsum_indptr_host_and_device_agree():
    lens = torch.tensor([5, 0, 9, 2], dtype=torch.int32)
    host = torch.zeros(5, dtype=torch.int32, pin_memory=True)
    dev = torch.zeros(5, dtype=torch.int32, device="cuda")
    cumsum_indptr_(lens, host, 4)
    cumsum_indptr_(lens.cuda(), dev, 4)
    assert host.tolist() == dev.tolist() == [0, 5, 5, 14, 16]


def test_graph_wrapper_keeps_bound_buffers():
    bs = 4
    workspace = torch.zeros(32 << 20, dtype=torch.uint8, device="cuda")
    indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
    indices = torch.arange(bs, dtype=torch.int32, device="cuda")
    last_page_len = torch.ones(bs, dtype=torch.int32, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(
        workspace,
        "NHD",
        use_cuda_graph=True,
        paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last_page_len,
    )
    w.plan(indptr, indices, last_page_len, 32, 8, 128, 1)  # ok: FC102
    assert w._paged_kv_indptr_buf.data_ptr() == indptr.data_ptr()  # ok: FC103


def test_trtllm_decode_smoke():
    if torch.cuda.get_device_capability()[0] < 10:
        pytest.skip("trtllm-gen needs Blackwell")
    bs, heads, kv_heads, head_dim, page = 2, 32, 8, 128, 16
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    q = torch.randn(bs, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    kv_cache = torch.randn(8, 2, kv_heads, page, head_dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([50, 64], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=kv_cache,
        workspace_buffer=workspace,
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_seq_len=64,
        bmm1_scale=head_dim**-0.5,
        bmm2_scale=1.0,
    )
    assert out.shape == q.shape
