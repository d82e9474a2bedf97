"""GPU checks of the comprehension-built wrappers, page lists and workspaces."""

from __future__ import annotations

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from densefi.config import EngineConfig
from densefi.workspace import trtllm_workspace_bytes
from densefi_ops.kv_pages import compaction_plan, remap_table, window_page_indices

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def small_config(**overrides) -> EngineConfig:
    base = dict(num_layers=2, hidden_size=256, intermediate_size=512, num_qo_heads=4, num_kv_heads=2, head_dim=64)
    return EngineConfig(**(base | overrides))


def test_compaction_plan_moves_high_pages_down():
    plan = compaction_plan(free_pages=[1, 2], used_pages=[0, 5, 7])
    assert plan == {7: 1, 5: 2}
    table = remap_table(plan, 8)
    assert table.tolist() == [0, 1, 2, 3, 4, 2, 6, 1]


def test_capture_sizes_are_sorted_and_unique():
    cfg = small_config(cudagraph_batch_sizes=(8, 1, 8, 4))
    assert cfg.cudagraph_batch_sizes == (1, 4, 8)  # ok: FC109


@cuda
def test_decode_wrapper_plans_from_device_indptr():
    cfg = small_config()
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda")
    w.plan(  # ok: FC102
        indptr,
        torch.arange(3, dtype=torch.int32, device="cuda"),
        torch.ones(2, dtype=torch.int32, device="cuda"),
        cfg.num_qo_heads,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.page_size,
    )
    kv = torch.randn(4, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.float16, device="cuda")
    q = torch.randn(2, cfg.num_qo_heads, cfg.head_dim, dtype=torch.float16, device="cuda")
    out = w.run(q, kv)
    assert out.isfinite().all().item()  # ok: FC101


@cuda
def test_window_page_indices_matches_host_reference():
    block_table = torch.arange(32, dtype=torch.int32, device="cuda").view(2, 16)
    seq_lens = torch.tensor([70, 5], dtype=torch.int32, device="cuda")
    indptr = torch.zeros(3, dtype=torch.int32, device="cuda")
    out = torch.full((2 * 3 + 1,), -1, dtype=torch.int32, device="cuda")
    window_page_indices(block_table, seq_lens, indptr, window=32, page_size=16, out=out)
    assert indptr.tolist() == [0, 3, 4]
    assert out[:4].tolist() == [2, 3, 4, 16]


@cuda
def test_trtllm_decode_with_zeroed_workspace():
    cfg = small_config(num_qo_heads=8, num_kv_heads=8, head_dim=128, max_num_seqs=4)
    ws = torch.zeros(trtllm_workspace_bytes(cfg), dtype=torch.uint8, device="cuda")  # ok: FC105
    kv = torch.randn(8, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(4, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(8, dtype=torch.int32, device="cuda").view(4, 2)
    seq_lens = torch.tensor([3, 17, 32, 9], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        query=q,
        kv_cache=kv,
        workspace_buffer=ws,
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_seq_len=32,
        bmm1_scale=cfg.head_dim**-0.5,
        bmm2_scale=1.0,
    )
    assert out.shape == q.shape
