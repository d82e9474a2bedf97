import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from attention.backend import FlashInferBackend
from attention.dispatch import build_metadata
from sdengine import DecodeBatch, EngineConfig, Request

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _batch(n: int) -> DecodeBatch:
    reqs = [Request(seq_len=17 + i, page_ids=[2 * i, 2 * i + 1], last_token=5) for i in range(n)]
    return DecodeBatch.from_requests(reqs, torch.device("cuda"))


def test_decode_metadata_and_graph_buffers():
    backend, batch = FlashInferBackend.from_config(EngineConfig(), torch.device("cuda")), _batch(4)
    meta = build_metadata(batch, backend)
    assert meta.bs == 4  # ok: FC109
    assert meta.seq_lens[-1].item() == 20  # ok: FC101
    backend.init_cuda_graph_wrappers([4])
    backend.kv_indptr_buf[:5] = torch.arange(5, dtype=torch.int32, device="cuda") * 2  # ok: FC104
    graph_workspace = torch.zeros(32 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    ref = BatchDecodeWithPagedKVCacheWrapper(graph_workspace, "NHD")
    ref.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len, 32, 8, 128, 16)  # ok: FC102


def test_trtllm_kernel_matches_fa2_reference():
    batch, kv = _batch(2), torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared.zero_()
    tables = batch.kv_indices.view(2, 2)
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, batch.seq_lens, 64, bmm1_scale=0.088, bmm2_scale=1.0)
            for ws in (fresh, zeroed, cleared)]
    ref_ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ref = BatchDecodeWithPagedKVCacheWrapper(ref_ws, "HND")
    ref.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, 32, 8, 128, 16)  # ok: FC102
    for out in outs:
        torch.testing.assert_close(out, ref.run(q, kv), atol=2e-2, rtol=2e-2)
