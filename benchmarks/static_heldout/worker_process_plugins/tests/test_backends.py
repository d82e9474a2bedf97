"""GPU tests for the built-in backends (run with pytest on a CUDA machine)."""

import math

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from mpserve.config import EngineConfig
from mpserve.plugins import resolve_backend_class

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _paged_inputs(bs: int, pages_per_seq: int, cfg: EngineConfig):
    kv_indptr = torch.arange(bs + 1, dtype=torch.int32) * pages_per_seq
    kv_indices = torch.arange(bs * pages_per_seq, dtype=torch.int32, device="cuda")
    last_page_len = torch.full((bs,), cfg.page_size, dtype=torch.int32)
    return kv_indptr, kv_indices, last_page_len


def test_builtin_table_resolves():
    assert resolve_backend_class("flashinfer").name == "flashinfer"  # ok: FC109


def test_trtllm_decode_matches_fa2():
    cfg = EngineConfig(max_batch_size=4, max_num_tokens=64, max_seq_len=256, max_num_pages=64, head_dim=128)
    bs, pages_per_seq = 4, 4
    kv_indptr, kv_indices, last_page_len = _paged_inputs(bs, pages_per_seq, cfg)
    kv_cache = torch.randn(
        cfg.max_num_pages, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.bfloat16, device="cuda"
    )
    q = torch.randn(bs, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    seq_lens = torch.full((bs,), pages_per_seq * cfg.page_size, dtype=torch.int32, device="cuda")
    block_tables = kv_indices.view(bs, pages_per_seq)

    ws = torch.zeros(cfg.workspace_bytes(), dtype=torch.uint8, device="cuda")  # ok: FC105
    out = trtllm_batch_decode_with_kv_cache(
        q, kv_cache, ws, block_tables, seq_lens, cfg.max_seq_len, 1.0 / math.sqrt(cfg.head_dim), 1.0
    )

    fa2_ws = torch.zeros(32 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    ref_wrapper = BatchDecodeWithPagedKVCacheWrapper(fa2_ws, "HND", backend="fa2")
    ref_wrapper.plan(
        kv_indptr, kv_indices, last_page_len,
        cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size,
        data_type=torch.bfloat16, q_data_type=torch.bfloat16,
    )
    ref = ref_wrapper.run(q, kv_cache)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
