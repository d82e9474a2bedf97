import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from backends.cascade_prefix import SharedPrefixCascadeBackend
from backends.flashinfer_paged import PagedDecodeBackend
from rcengine import AttentionImpl, ServeConfig, SupportsCascade, SupportsCudaGraph


def test_capabilities_are_structural():
    cfg = ServeConfig(total_pages=256, max_batch=8, max_tokens=512)
    kv = [torch.zeros(256, 2, 16, 8, 128, device="cuda")]
    paged, cascade = PagedDecodeBackend(cfg, kv), SharedPrefixCascadeBackend(cfg, kv)
    assert isinstance(paged, SupportsCudaGraph) and not isinstance(cascade, SupportsCudaGraph)  # ok: FC109
    assert isinstance(cascade, SupportsCascade) and isinstance(paged, AttentionImpl)  # ok: FC109
    paged.init_cuda_graph_state(8)
    paged.kv_indptr_buf[1:].fill_(2)  # ok: FC104
    assert paged.kv_indptr_buf[-1].item() == 2  # ok: FC101


def test_trtllm_decode_workspace():
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    lens = torch.full((2,), 64, dtype=torch.int32, device="cuda")
    fresh = torch.empty(2 * 32 * 8192, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(2 * 32 * 8192, dtype=torch.uint8, device="cuda")  # ok: FC105
    torch.testing.assert_close(trtllm_batch_decode_with_kv_cache(q, kv, fresh, tables, lens, 64),
                               trtllm_batch_decode_with_kv_cache(q, kv, zeroed, tables, lens, 64))
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 4, 8], dtype=torch.int32, device="cuda")
    w.plan(indptr, tables.flatten(), torch.ones(2, dtype=torch.int32, device="cuda"), 32, 8, 128, 16)  # ok: FC102
    prefill_ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    BatchPrefillWithPagedKVCacheWrapper(prefill_ws, "NHD", backend="fa3").plan(indptr, indptr, tables.flatten(),
                                                                                 indptr[1:] % 16 + 1, 32, 8, 128, 16)
