import numpy as np
import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from rwkvserve import PAGE_SIZE, HybridConfig, StepPlan, build_attn_meta
from hyb_attn.backend import HybridAttnBackend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
CFG, DEV = HybridConfig(num_layers=4, max_batch=8, max_pages=64, buckets=(1, 2, 4)), torch.device("cuda")

def _meta(n: int):
    plan = StepPlan(list(range(n)), list(range(n)), True, np.full(n, 2 * PAGE_SIZE), np.ones(n), [[2 * i, 2 * i + 1] for i in range(n)],
                    torch.zeros(n, dtype=torch.int64, device=DEV))
    return build_attn_meta(plan, DEV)

def test_replace_and_decode_workspaces():
    meta, q = _meta(4), torch.randn(4, 32, 128, device=DEV).half()
    assert meta._replace(seq_lens=meta.seq_lens + 1).seq_lens.tolist() == [2 * PAGE_SIZE + 1] * 4  # ok: FC101
    kv, tables = torch.randn(8, 2, 8, PAGE_SIZE, 128, device=DEV).half(), torch.arange(8, dtype=torch.int32, device=DEV).view(4, 2)
    fresh = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)  # expect: FC105
    zeroed = torch.zeros(CFG.max_batch * 16512, dtype=torch.uint8, device=DEV)  # ok: FC105
    fixed = torch.zeros(128 << 20, dtype=torch.uint8, device=DEV)  # ok: FC106
    scrubbed = torch.empty(CFG.max_batch * 16512, dtype=torch.uint8, device=DEV)  # ok: FC105
    scrubbed.zero_()
    outs = [trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, meta.seq_lens, 32, 128**-0.5, 1.0) for ws in (zeroed, fixed, scrubbed)]
    outs.append(trtllm_batch_decode_with_kv_cache(q, kv, fresh, tables, meta.seq_lens, 32, 128**-0.5, 1.0))
    recycled = zeroed.new_empty(zeroed.shape)  # expect: FC105
    outs.append(trtllm_batch_decode_with_kv_cache(q, kv, recycled, tables, meta.seq_lens, 32, 128**-0.5, 1.0))
    fa2 = BatchDecodeWithPagedKVCacheWrapper(torch.empty(256 << 20, dtype=torch.uint8, device=DEV), "HND")  # ok: FC106
    fa2.plan(meta.kv_indptr, meta.kv_indices, meta.last_page_len, 32, 8, 128, PAGE_SIZE)  # ok: FC102
    fa2_b = BatchDecodeWithPagedKVCacheWrapper(torch.empty(CFG.max_batch * 16512, dtype=torch.uint8, device=DEV), "HND")  # ok: FC105
    assert all(torch.allclose(o, outs[0], atol=2e-2) for o in outs) and fa2.run(q, kv).shape == fa2_b.run(q, kv).shape  # ok: FC109

def test_graph_buffers_survive_a_scribble():
    backend = HybridAttnBackend(CFG, DEV)
    backend.init_graph_state()
    backend.kv_indptr_buf.fill_(7)  # ok: FC104
    meta = backend.plan_bucket(_meta(2), 2)
    assert backend.kv_indptr_buf[:3].tolist() == meta.kv_indptr_cpu.tolist()[:3]  # ok: FC101
