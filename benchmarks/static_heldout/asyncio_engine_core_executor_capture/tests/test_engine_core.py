import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from aecore import PAGE_SIZE, EngineConfig
from aecore_attn.flashinfer_backend import FlashInferBackend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
WS = 64 << 20
CFG = EngineConfig(num_layers=2, num_pages=256, max_num_seqs=8, cuda_graph_batch_sizes=(1, 2, 4, 8))


def test_decode_kernels_plans_and_graph_state():
    q, kv = torch.randn(4, 32, 128, dtype=torch.bfloat16, device="cuda"), torch.randn(64, 2, 8, PAGE_SIZE, 128, dtype=torch.bfloat16, device="cuda")
    tables, lens = torch.arange(16, dtype=torch.int32, device="cuda").view(4, 4), torch.full((4,), 64, dtype=torch.int32, device="cuda")
    fresh = torch.empty(WS, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.empty(WS, dtype=torch.uint8, device="cuda")  # ok: FC105
    zeroed.zero_()
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 64, 128 ** -0.5, 1.0) for ws in (fresh, zeroed)]
    torch.testing.assert_close(outs[0], outs[1])
    fa2_ws = torch.empty(WS, dtype=torch.uint8, device="cuda")  # ok: FC105
    trt_ws = torch.zeros(WS, dtype=torch.uint8, device="cuda")  # ok: FC105
    for w in (BatchDecodeWithPagedKVCacheWrapper(fa2_ws, "NHD"), BatchDecodeWithPagedKVCacheWrapper(trt_ws, "HND", backend="trtllm-gen")):
        w.plan(lens.new_tensor([0, 4, 8, 12, 16]), tables.flatten(), lens % PAGE_SIZE + 1, 32, 8, 128, PAGE_SIZE)  # ok: FC102
    backend = FlashInferBackend(CFG, torch.device("cuda"))
    backend.init_cuda_graph_state()
    backend.kv_indices[:4] = torch.arange(4, dtype=torch.int32, device="cuda")  # ok: FC104
    assert backend.kv_indptr.tolist()[:2] == [0, 0]
    workspace = torch.zeros(WS, dtype=torch.uint8, device="cuda")  # ok: FC106
    assert not BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD").is_cuda_graph_enabled  # ok: FC109
