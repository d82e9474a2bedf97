import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from apm.config import EngineConfig

WS = 32 << 20
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_trtllm_gen_matches_fa2():
    cfg = EngineConfig(num_qo_heads=8, num_kv_heads=2, max_batch_size=8)
    bs, ppr, dev = 4, 3, "cuda"  # four requests of three pages
    kv_indptr = torch.arange(0, (bs + 1) * ppr, ppr, dtype=torch.int32, device=dev)
    kv_indices = torch.arange(bs * ppr, dtype=torch.int32, device=dev)
    last = torch.full((bs,), 7, dtype=torch.int32, device=dev)
    cache = torch.randn(bs * ppr, 2, cfg.page_size, 2, cfg.head_dim, dtype=torch.half, device=dev)
    q = torch.randn(bs, 8, cfg.head_dim, dtype=torch.half, device=dev)
    fa2 = BatchDecodeWithPagedKVCacheWrapper(torch.empty(WS, dtype=torch.uint8, device=dev), "NHD")  # ok: FC105
    fa2.plan(kv_indptr, kv_indices, last, *cfg.plan_dims())  # ok: FC102
    ref = fa2.run(q, cache)
    assert fa2._plan_info is not None  # ok: FC103
    ragged = BatchPrefillWithRaggedKVCacheWrapper(torch.zeros(WS, dtype=torch.uint8, device=dev), "NHD")  # ok: FC106
    ragged.plan(kv_indptr, kv_indptr, 8, 2, cfg.head_dim, causal=True)  # ok: FC102
    seq_lens = (ppr - 1) * cfg.page_size + last
    max_len = seq_lens.max().item()  # ok: FC101
    zeroed = torch.zeros(WS, dtype=torch.uint8, device=dev)  # ok: FC105
    filled = torch.empty(WS, dtype=torch.uint8, device=dev).fill_(0)  # ok: FC105
    cleared = torch.empty(WS, dtype=torch.uint8, device=dev)  # ok: FC105
    cleared.zero_()
    fresh = torch.empty(WS, dtype=torch.uint8, device=dev)  # expect: FC105
    for ws in (zeroed, filled, cleared, fresh):
        out = trtllm_batch_decode_with_kv_cache(q, cache, ws, kv_indices.view(bs, ppr), seq_lens, max_len, bmm1_scale=cfg.head_dim**-0.5, bmm2_scale=1.0)
        assert torch.allclose(out, ref, atol=2e-3, rtol=2e-3)  # ok: FC109
