import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from dpserve import PAGE_SIZE, DPConfig, decode_workspace_bytes
from dp_attn.wrapper_pool import WrapperPool

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
CFG = DPConfig(device_ids=(0, 1), graph_buckets=(1, 2, 4))

def _decode_inputs(dev: int):
    with torch.cuda.device(dev):
        q, kv = torch.randn(4, 32, 128, device="cuda").half(), torch.randn(8, 2, 8, PAGE_SIZE, 128, device="cuda").half()
        tables = torch.arange(8, dtype=torch.int32, device="cuda").view(4, 2)
        return q, kv, tables, torch.full((4,), 2 * PAGE_SIZE, dtype=torch.int32, device="cuda")

def test_trtllm_decode_workspaces_agree():
    q, kv, tables, seq_lens = _decode_inputs(1)
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:1")  # expect: FC105
    zeroed = torch.zeros(decode_workspace_bytes(CFG), dtype=torch.uint8, device="cuda:1")  # ok: FC105
    scrubbed = torch.empty(decode_workspace_bytes(CFG), dtype=torch.uint8, device="cuda:1")  # ok: FC105
    scrubbed.zero_()
    ref = trtllm_batch_decode_with_kv_cache(q, kv, zeroed, tables, seq_lens, 2 * PAGE_SIZE, 128**-0.5, 1.0)
    out = trtllm_batch_decode_with_kv_cache(q, kv, fresh, tables, seq_lens, 2 * PAGE_SIZE, 128**-0.5, 1.0)
    again = trtllm_batch_decode_with_kv_cache(q, kv, scrubbed, tables, seq_lens, 2 * PAGE_SIZE, 128**-0.5, 1.0)
    assert torch.allclose(out, ref, atol=1e-2) and torch.allclose(again, ref, atol=1e-2)  # ok: FC109

def test_plans_and_bucket_buffers_per_device():
    q, kv, _, _ = _decode_inputs(0)
    indptr, last = torch.tensor([0, 2, 4, 6, 8], dtype=torch.int32), torch.full((4,), PAGE_SIZE, dtype=torch.int32)
    indices = torch.arange(8, dtype=torch.int32, device="cuda:0")
    fa2 = BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda:0"), "HND")  # ok: FC106
    fa2.plan(indptr.to("cuda:0"), indices, last, 32, 8, 128, PAGE_SIZE)  # ok: FC102
    assert len(fa2.run(q, kv).argmax(-1).flatten().tolist()) == 4 * 32  # ok: FC101
    trt = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(256 << 20, dtype=torch.uint8, device="cuda:0"), "HND", backend="trtllm-gen")  # ok: FC106
    trt.plan(indptr, indices, last, 32, 8, 128, PAGE_SIZE)
    assert trt.run(q, kv).float().abs().sum().item() > 0  # ok: FC101
    pool = WrapperPool(CFG)
    pool.init_graph_wrappers()
    pool.kv_indptr_buf[1][1:].fill_(3)  # ok: FC104
    assert pool.kv_indptr_buf[0].sum().item() == 0 and pool.kv_indptr_buf[1].device.index == 1
