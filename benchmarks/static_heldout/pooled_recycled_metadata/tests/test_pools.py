import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from poolserve.config import ServeConfig
from poolserve.pools import TensorPool

WS = 64 << 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_recycled_workspace_decodes_like_fa2():
    cfg, dev = ServeConfig(num_qo_heads=8, num_kv_heads=2, max_batch_size=4), "cuda"
    pool = TensorPool(torch.device(dev))
    t = pool.acquire(5)
    pool.release(t)
    assert pool.acquire(7) is t  # ok: FC109
    indptr, indices = torch.tensor([0, 2, 4], dtype=torch.int32, device=dev), torch.arange(4, dtype=torch.int32, device=dev)
    last = torch.full((2,), 5, dtype=torch.int32, device=dev)
    cache = torch.randn(4, 2, cfg.page_size, 2, cfg.head_dim, dtype=torch.half, device=dev)
    q = torch.randn(2, 8, cfg.head_dim, dtype=torch.half, device=dev)
    fa2 = BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8, device=dev), "NHD")  # ok: FC105
    fa2.plan(indptr, indices, last, *cfg.plan_dims())  # ok: FC102
    ref, info = fa2.run(q, cache), fa2._plan_info  # ok: FC103
    trt = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(WS, dtype=torch.uint8, device=dev), "NHD", backend="trtllm-gen")  # ok: FC106
    trt.plan(indptr, indices, last, *cfg.plan_dims())  # ok: FC102
    torch.testing.assert_close(trt.run(q, cache), ref, atol=2e-3, rtol=2e-3)
    seq_lens = cfg.page_size + last
    max_len = seq_lens.max().item()  # ok: FC101
    zeroed = torch.empty(WS, dtype=torch.uint8, device=dev).fill_(0)  # ok: FC105
    cleared = torch.empty(WS, dtype=torch.uint8, device=dev)  # ok: FC105
    cleared.zero_()
    fresh = torch.empty(WS, dtype=torch.uint8, device=dev)  # expect: FC105
    for ws in (zeroed, cleared, fresh):
        out = trtllm_batch_decode_with_kv_cache(q, cache, ws, indices.view(2, 2), seq_lens, max_len, bmm1_scale=cfg.head_dim**-0.5, bmm2_scale=1.0)
        torch.testing.assert_close(out, ref, atol=2e-3, rtol=2e-3)
    assert info is not None
