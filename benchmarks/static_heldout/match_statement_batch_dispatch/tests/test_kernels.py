# GPU checks run before a release, not in the serving process.
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mdispatch import PAGE_SIZE, EngineConfig

C = EngineConfig()


def test_trtllm_decode_same_output_on_fresh_and_zeroed_workspace():
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    q = torch.randn(4, C.num_qo_heads, C.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, C.num_kv_heads, PAGE_SIZE, C.head_dim, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(8, dtype=torch.int32, device="cuda").view(4, 2)
    lens = torch.full((4,), 2 * PAGE_SIZE, dtype=torch.int32, device="cuda")
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 2 * PAGE_SIZE, C.head_dim ** -0.5, 1.0)
            for ws in (fresh, zeroed)]
    assert torch.allclose(outs[0], outs[1], atol=1e-2)  # ok: FC109


def test_plans_accept_device_and_host_indptr():
    ws = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    decode = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32).cuda()
    decode.plan(indptr, indptr[:2].clone(), torch.ones(2, dtype=torch.int32).cuda(), 32, 8, 128, PAGE_SIZE)  # ok: FC102
    trtllm_ws = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    trtllm_ws.zero_()
    BatchDecodeWithPagedKVCacheWrapper(trtllm_ws, "HND", backend="trtllm-gen")
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    ragged = BatchPrefillWithRaggedKVCacheWrapper(workspace, "NHD")
    ragged.plan(indptr, indptr, 32, 8, 128, causal=True)  # ok: FC102
    assert indptr[-1].item() == 2  # ok: FC101
