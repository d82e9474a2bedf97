import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from kvobs import PAGE_SIZE, ServerConfig
from kvobs_exec.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
WS_BYTES = 32 << 20
CFG = ServerConfig(num_layers=2, num_pages=512, max_running=8, max_context=1024)


def test_trtllm_workspaces():
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(16, 2, 8, PAGE_SIZE, 128, dtype=torch.bfloat16, device="cuda")
    tables, lens = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4), torch.full((2,), 64, dtype=torch.int32, device="cuda")
    fresh = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    torch.testing.assert_close(*[trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 64) for ws in (fresh, zeroed)])
    gen_ws = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    fa2_ws = torch.empty(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    ragged_ws = torch.empty_like(fa2_ws)  # ok: FC105
    BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "NHD")
    for w in (BatchDecodeWithPagedKVCacheWrapper(gen_ws, "NHD", backend="trtllm-gen"), BatchDecodeWithPagedKVCacheWrapper(fa2_ws, "NHD")):
        w.plan(torch.tensor([0, 4, 8], dtype=torch.int32, device="cuda"), tables.flatten(), lens % PAGE_SIZE + 1, 32, 8, 128, PAGE_SIZE)  # ok: FC102


def test_observers_and_graphs():
    runner = ModelRunner(CFG, torch.device("cuda"))
    runner.graph_runner.capture()
    runner.attn_backend.kv_indices[:4] = torch.arange(4, dtype=torch.int32, device="cuda")  # ok: FC104
    assert runner.attn_backend.kv_indptr.tolist()[0] == 0  # ok: FC101
    workspace = torch.zeros(WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    assert not BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD").is_cuda_graph_enabled  # ok: FC109
    del runner.graph_runner  # its weak listeners must drop out
    assert runner.block_manager.compacted.emit(torch.arange(CFG.num_pages, dtype=torch.int32)) == 1
