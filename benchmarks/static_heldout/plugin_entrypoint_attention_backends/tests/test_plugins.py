import flashinfer
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from peab.registry import load_backend, registered


def test_registered_and_imported_plugins():
    assert load_backend("fi_paged").plugin_name == "fi_paged"  # ok: FC109
    assert not load_backend("trtllm_gen").supports_cuda_graph  # ok: FC109
    assert "fi_window" in registered()


def _trtllm_decode(ws: torch.Tensor) -> torch.Tensor:
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    seq_lens = torch.tensor([33, 64], dtype=torch.int32, device="cuda")
    return trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, 64)


def test_trtllm_decode_fresh_and_zeroed_workspace():
    fresh = _trtllm_decode(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))  # expect: FC105
    zeroed = _trtllm_decode(torch.zeros(64 << 20, dtype=torch.uint8, device="cuda"))  # ok: FC105
    cleared = _trtllm_decode(torch.empty(64 << 20, dtype=torch.uint8, device="cuda").zero_())  # ok: FC105
    torch.testing.assert_close(fresh, zeroed)
    torch.testing.assert_close(cleared, zeroed)


def test_fa2_plans_on_device_tensors():
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    prefill_ws = torch.empty_like(ws)  # ok: FC105
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    p = flashinfer.BatchPrefillWithPagedKVCacheWrapper(prefill_ws, "NHD")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda")
    indices = torch.arange(3, dtype=torch.int32, device="cuda")
    last = torch.tensor([5, 16], dtype=torch.int32, device="cuda")
    w.plan(indptr, indices, last, 32, 8, 128, 16)
    p.plan(indptr, indptr, indices, last, 32, 8, 128, 16)
    indptr.zero_()  # ok: FC104
