import flashinfer
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mcmb_builders.base import BUILDERS
from mcmb_builders.variants import SlidingWindowBuilder, TrtllmGenBuilder


def test_each_attention_type_has_one_builder():
    assert BUILDERS["sliding"] is SlidingWindowBuilder  # ok: FC109
    assert BUILDERS["trtllm_gen"].decode_backend == "trtllm-gen"  # ok: FC109
    names = [c.__name__ for c in TrtllmGenBuilder.__mro__]
    assert names.index("GraphBufferMixin") < names.index("MetadataBuilderBase")  # ok: FC109


def _decode(ws: torch.Tensor) -> torch.Tensor:
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    seq_lens = torch.tensor([33, 64], dtype=torch.int32, device="cuda")
    return trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, 64)


def test_trtllm_decode_workspaces():
    ref = _decode(torch.zeros(64 << 20, dtype=torch.uint8, device="cuda"))  # ok: FC105
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    torch.testing.assert_close(_decode(ws), ref)
    fresh = _decode(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))  # expect: FC105
    assert torch.isfinite(fresh).all().item()  # ok: FC101


def test_fa2_graph_wrapper_plans_device_buffers():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    ragged_ws = torch.full((32 << 20,), 0, dtype=torch.uint8, device="cuda")  # ok: FC106
    prefill_ws = torch.empty_like(ws)  # ok: FC105
    graph_ws = torch.empty(ws.numel(), dtype=torch.uint8, device="cuda")  # ok: FC105
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda")
    indices = torch.arange(3, dtype=torch.int32, device="cuda")
    last = torch.tensor([5, 16], dtype=torch.int32, device="cuda")
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        graph_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last)
    w.plan(indptr, indices, last, 32, 8, 128, 16)  # ok: FC102
    flashinfer.BatchPrefillWithPagedKVCacheWrapper(prefill_ws, "NHD").plan(indptr, indptr, indices, last, 32, 8, 128, 16)
    flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "NHD").plan(indptr, indptr, 32, 8, 128)
    flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD").plan(indptr, indices, last, 32, 8, 128, 16)
    indptr.zero_()  # ok: FC104
