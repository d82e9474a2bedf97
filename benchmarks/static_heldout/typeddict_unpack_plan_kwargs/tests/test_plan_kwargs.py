"""Plan-kwargs layering and the trtllm-gen decode workspace (GPU tests)."""
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from tdengine import PAGE_SIZE, PLAN_DEFAULTS, merge_plan_kwargs, wrapper_kwargs


def test_overrides_win_over_defaults():
    kw = wrapper_kwargs("decode", use_cuda_graph=True)
    assert kw["backend"] == "trtllm-gen" and kw["use_cuda_graph"] is True  # ok: FC109
    assert merge_plan_kwargs(PLAN_DEFAULTS, head_dim=64)["page_size"] == PAGE_SIZE


def test_trtllm_decode_needs_zeroed_workspace():
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 2, PAGE_SIZE, 2, 128, dtype=torch.bfloat16, device="cuda")
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([20, 32], dtype=torch.int32, device="cuda")
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    scrubbed = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    scrubbed.zero_()
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 32) for ws in (zeroed, scrubbed, fresh)]
    ref = BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC105
    ref.plan(torch.tensor([0, 2, 4], dtype=torch.int32, device="cuda"), tables.flatten(),  # ok: FC102
             torch.tensor([4, 16], dtype=torch.int32), 8, 2, 128, PAGE_SIZE)
    for out in outs:
        torch.testing.assert_close(out, ref.run(q, kv), rtol=2e-2, atol=2e-2)
    assert outs[0].isfinite().all().item()  # ok: FC101


def test_fixed_workspace_wrapper_plans():
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(64 << 20, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC106
    w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([3], dtype=torch.int32, device="cuda"),
           torch.tensor([7], dtype=torch.int32), **merge_plan_kwargs(PLAN_DEFAULTS, num_qo_heads=8, num_kv_heads=2, head_dim=128))
