"""GPU tests of the module-global state plumbing (pytest, one CUDA device)."""
import types

import flashinfer
import pytest
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from gsrt import config as C
from gsrt import kvpool as K
from gsrt import state as S


def _pages_for(n_tokens, page_size=C.PAGE_SIZE):
    assert n_tokens > 0 and page_size > 0  # ok: FC109
    return -(-n_tokens // page_size)


@pytest.fixture(scope="module", autouse=True)
def buffers():
    S.init_buffers(8, 256, 512)
    K.init_kv_cache(256)
    yield


def _req(rid):
    return types.SimpleNamespace(req_id=rid)


def _two_requests():
    K.alloc_for(1, 40)
    K.alloc_for(2, 3)
    return K.build_page_table([_req(1), _req(2)], 4)


def test_page_table_mirrors_match_device():
    _two_requests()
    S.kv_indptr[:5].copy_(S.kv_indptr_cpu[:5])
    assert S.kv_indptr[2].item() == _pages_for(40) + _pages_for(3)  # ok: FC101
    assert S.kv_last_page_len_np[:2].tolist() == [40 - 2 * C.PAGE_SIZE, 3]
    assert S.kv_last_page_len_np[2:4].tolist() == [0, 0]


def test_decode_plan_with_host_mirrors():
    nnz = _two_requests()
    S.kv_indices[:nnz].copy_(S.kv_indices_cpu[:nnz])
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(
        S.kv_indptr_cpu[:3],
        S.kv_indices[: int(S.kv_indptr_np[2])],
        S.kv_last_page_len_cpu[:2],
        C.NUM_Q_HEADS,
        C.NUM_KV_HEADS,
        C.HEAD_DIM,
        C.PAGE_SIZE,
        q_data_type=S.DTYPE,
    )
    q = torch.randn(2, C.NUM_Q_HEADS, C.HEAD_DIM, dtype=S.DTYPE, device="cuda")
    out = w.run(q, S.kv_caches[0])
    assert out.shape == q.shape


def test_trtllm_decode_zeroed_workspace():
    _two_requests()
    S.block_tables[:2].copy_(S.block_tables_cpu[:2])
    S.seq_lens[:2].copy_(S.seq_lens_cpu[:2])
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    q = torch.randn(2, C.NUM_Q_HEADS, C.HEAD_DIM, dtype=S.DTYPE, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=S.kv_caches[C.LAYER_KINDS.index("global")],
        workspace_buffer=ws,
        block_tables=S.block_tables[:2],
        seq_lens=S.seq_lens[:2],
        max_seq_len=64,
        bmm1_scale=C.HEAD_DIM ** -0.5,
        bmm2_scale=1.0,
    )
    assert torch.isfinite(out.float()).all()


def test_host_growth_keeps_contents():
    S.kv_indices_np[:4] = [7, 8, 9, 10]
    cap = S.kv_indices_cpu.numel()
    S.ensure_host_capacity(cap + 1)
    assert S.kv_indices_cpu.numel() > cap
    assert S.kv_indices_np[:4].tolist() == [7, 8, 9, 10]


def test_ragged_prefill_matches_reference():
    lens = [5, 11, 3]
    qo = torch.tensor([0, 5, 16, 19], dtype=torch.int32)
    ws = torch.empty(S.max_tokens * C.NUM_Q_HEADS * 1024, dtype=torch.uint8, device="cuda")  # ok: FC105
    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
    w.plan(qo, qo, C.NUM_Q_HEADS, C.NUM_KV_HEADS, C.HEAD_DIM, causal=True, q_data_type=S.DTYPE)
    n = sum(lens)
    q = torch.randn(n, C.NUM_Q_HEADS, C.HEAD_DIM, dtype=S.DTYPE, device="cuda")
    k = torch.randn(n, C.NUM_KV_HEADS, C.HEAD_DIM, dtype=S.DTYPE, device="cuda")
    v = torch.randn_like(k)
    out = w.run(q, k, v)
    first = flashinfer.single_prefill_with_kv_cache(q[:5], k[:5], v[:5], causal=True)
    torch.testing.assert_close(out[:5], first, rtol=2e-2, atol=2e-2)
