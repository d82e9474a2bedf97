"""The token-granular FlashInfer decode must agree with trtllm-gen on the same KV regrouped
into 16-token pages (trtllm-gen does not take page size 1)."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

HEADS, KV_HEADS, DIM, PAGE = 8, 2, 128, 16


@pytest.fixture
def trtllm_workspace():
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    return ws


def _regroup(k_tok: torch.Tensor, v_tok: torch.Tensor, seq_len: int):
    pages = (seq_len + PAGE - 1) // PAGE
    k = torch.zeros(pages * PAGE, KV_HEADS, DIM, dtype=k_tok.dtype, device=k_tok.device)
    v = torch.zeros_like(k)
    k[:seq_len], v[:seq_len] = k_tok, v_tok
    kv = torch.stack([k.view(pages, PAGE, KV_HEADS, DIM), v.view(pages, PAGE, KV_HEADS, DIM)], dim=1)
    return kv.transpose(2, 3).contiguous(), torch.arange(pages, dtype=torch.int32, device=k_tok.device)[None]


def _token_granular_decode(q, k_tok, v_tok, seq_len):
    ws = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    indptr = torch.tensor([0, seq_len], dtype=torch.int32)
    w.plan(indptr, torch.arange(seq_len, dtype=torch.int32, device="cuda"), torch.ones(1, dtype=torch.int32), HEADS, KV_HEADS, DIM, 1, q_data_type=q.dtype)
    return w.run(q, (k_tok.unsqueeze(1), v_tok.unsqueeze(1)))


def test_parity(trtllm_workspace):
    seq_len = 300
    q = torch.randn(1, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    k_tok = torch.randn(seq_len, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    v_tok = torch.randn_like(k_tok)
    kv, block_tables = _regroup(k_tok, v_tok, seq_len)
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device="cuda")
    ref = trtllm_batch_decode_with_kv_cache(q, kv, trtllm_workspace, block_tables, seq_lens, seq_len, DIM ** -0.5, 1.0)
    out = _token_granular_decode(q, k_tok, v_tok, seq_len)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_trtllm_smoke_long_context():
    seq_len = 8192
    q = torch.randn(4, HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    k_tok = torch.randn(seq_len, KV_HEADS, DIM, dtype=torch.bfloat16, device="cuda")
    kv, block_tables = _regroup(k_tok, k_tok, seq_len)
    workspace = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # expect: FC105
    seq_lens = torch.full((4,), seq_len, dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(q, kv, workspace, block_tables.expand(4, -1), seq_lens, seq_len, DIM ** -0.5, 1.0)
    assert torch.isfinite(out).all()
