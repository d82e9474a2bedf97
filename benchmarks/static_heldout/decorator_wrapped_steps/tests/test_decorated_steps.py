import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from dwserve.config import ServeConfig
from dwserve.decorators import STEP_SECONDS, step_timer

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@cuda
def test_decode_plan_from_host_indptr():
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(32 << 20, dtype=torch.uint8, device="cuda"), "NHD")  # ok: FC106
    w.plan(torch.tensor([0, 1, 3], dtype=torch.int32), torch.arange(3, dtype=torch.int32, device="cuda"),
           torch.ones(2, dtype=torch.int32), 8, 8, 128, 16)
    assert w._plan_info is not None  # ok: FC103
    run = step_timer("sample")(w.run)
    out = run(torch.randn(2, 8, 128, dtype=torch.half, device="cuda"), torch.randn(3, 2, 16, 8, 128, dtype=torch.half, device="cuda"))
    assert STEP_SECONDS["sample"] > 0.0  # ok: FC109
    assert not torch.isnan(out).any().item()  # ok: FC101


@cuda
def test_trtllm_decode_same_result_on_every_workspace():
    nbytes = ServeConfig().trtllm_workspace_bytes()
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    lens = torch.tensor([20, 30], dtype=torch.int32, device="cuda")
    fresh = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # expect: FC105
    zeroed = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    filled.fill_(0)
    cleared = torch.empty(nbytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    cleared.zero_()
    chained = torch.empty(nbytes, dtype=torch.uint8, device="cuda").zero_()  # ok: FC105
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 32, bmm1_scale=128**-0.5, bmm2_scale=1.0)
            for ws in (fresh, zeroed, filled, cleared, chained)]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0])
