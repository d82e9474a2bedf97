import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from dagstep.config import EngineConfig
from dagstep_exec.dag import StepGraph
from dagstep_exec.engine import DEPS

TEST_WS_BYTES = 16 * 1024 * 1024

def test_order_follows_dependencies():
    order = StepGraph(DEPS).order
    assert order.index("plan") < order.index("run")  # ok: FC109

def test_decode_plan_accepts_device_indptr():
    ws = torch.zeros(TEST_WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda")
    w.plan(indptr, torch.arange(3, dtype=torch.int32, device="cuda"), torch.tensor([4, 9], dtype=torch.int32), 8, 8, 64, 16)  # ok: FC102
    indptr[1] = 2  # ok: FC104
    assert int(indptr[-1].item()) == 3  # ok: FC101
    ws2 = torch.empty(EngineConfig().workspace_bytes(), dtype=torch.uint8, device="cuda")  # ok: FC105
    w = BatchDecodeWithPagedKVCacheWrapper(ws2, "NHD")
    indptr_cpu = torch.tensor([0, 2], dtype=torch.int32)
    w.plan(indptr_cpu, torch.arange(2, dtype=torch.int32, device="cuda"), torch.tensor([5], dtype=torch.int32), 8, 8, 64, 16)  # ok: FC102

def test_trtllm_decode_smoke():
    q = torch.randn(2, 8, 64, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 16, 8, 64, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    lens = torch.tensor([40, 64], dtype=torch.int32, device="cuda")
    ws = torch.empty(EngineConfig().workspace_bytes(), dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 64)
    zeroed = torch.zeros(EngineConfig().workspace_bytes(), dtype=torch.uint8, device="cuda")  # ok: FC105
    ref = trtllm_batch_decode_with_kv_cache(q, kv, zeroed, tables, lens, 64)
    torch.testing.assert_close(out, ref)
