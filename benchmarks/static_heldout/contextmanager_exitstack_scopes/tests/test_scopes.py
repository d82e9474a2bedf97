import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from attention.backend import FlashInferScopedBackend
from scopes.config import EngineConfig

TEST_WORKSPACE_BYTES = 32 << 20


@pytest.mark.parametrize("bs", [1, 2, 4])
def test_capture_scope_stages_dummy_indptr(bs):
    cfg = EngineConfig(max_batch_size=8, max_num_tokens=64, max_seq_len=256, graph_buckets=(1, 2, 4, 8))
    backend = FlashInferScopedBackend(cfg, torch.device("cuda"))
    backend.init_graph_wrappers()
    with backend.capture_scope(bs):
        torch.cuda.synchronize()  # ok: FC101
        assert backend.kv_indptr_buf[: bs + 1].cpu().tolist() == list(range(bs + 1))  # ok: FC101
    assert backend.capturing_bs is None and bs in backend.graph_wrappers  # ok: FC109
    w = backend.graph_wrappers[bs]
    indptr = torch.arange(bs + 1, dtype=torch.int32, device="cuda")
    w.plan(indptr, backend.kv_indices_buf, torch.ones(bs, dtype=torch.int32, device="cuda"), 32, 8, 128, 16)  # ok: FC102
    assert w._plan_info is not None and backend.kv_indptr_buf[bs].item() == bs  # ok: FC103


def test_trtllm_kernel_workspaces():
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    tables, lens = torch.zeros(1, 1, dtype=torch.int32, device="cuda"), torch.ones(1, dtype=torch.int32, device="cuda")
    fresh = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared.zero_()
    filled = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled.fill_(0)
    chained = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda").zero_()  # ok: FC105
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 16, bmm1_scale=1.0, bmm2_scale=1.0)
            for ws in (fresh, zeroed, cleared, filled, chained)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0])
    fa2 = BatchDecodeWithPagedKVCacheWrapper(torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC106
    fa2.plan(torch.tensor([0, 1], dtype=torch.int32), tables[0], torch.ones(1, dtype=torch.int32), 32, 8, 128, 16)
