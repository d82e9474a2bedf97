"""Snapshot semantics of the metadata values, and a replay smoke test on the GPU."""

from __future__ import annotations

import copy
from dataclasses import astuple, replace

import pytest
import torch
from flashinfer import trtllm_batch_decode_with_kv_cache

from snapserve.batch import Request
from snapserve.config import EngineConfig
from snapserve.metadata import (
    BlockTableView,
    DecodeMetadata,
    DecodePlanArgs,
    RequestUpdate,
    detached,
    fold_host_updates,
)

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _meta(n: int = 2, device: str = "cpu") -> DecodeMetadata:
    i32 = dict(dtype=torch.int32, device=device)
    return DecodeMetadata(
        num_reqs=n,
        kv_indptr=torch.arange(n + 1, **i32),
        kv_indices=torch.arange(n, **i32),
        kv_last_page_len=torch.ones(n, **i32),
        seq_lens=torch.ones(n, **i32),
        kv_indptr_cpu=torch.arange(n + 1, dtype=torch.int32),
        kv_last_page_len_cpu=torch.ones(n, dtype=torch.int32),
        seq_lens_cpu=torch.ones(n, dtype=torch.int32),
    )


def test_replace_shares_unreplaced_tensors():
    meta = _meta()
    other = replace(meta, num_reqs=1)
    assert other.kv_indptr is meta.kv_indptr  # ok: FC109
    assert other.num_reqs == 1


def test_shallow_copy_shares_and_deepcopy_detaches():
    meta = _meta()
    shallow = copy.copy(meta)
    deep = detached(meta)
    assert shallow.kv_indices.data_ptr() == meta.kv_indices.data_ptr()
    assert deep.kv_indices.data_ptr() != meta.kv_indices.data_ptr()
    assert deep.wrapper is None


def test_plan_args_follow_plan_signature():
    cfg = EngineConfig(num_qo_heads=4, num_kv_heads=1, head_dim=64)
    args = astuple(DecodePlanArgs.from_meta(_meta(3), cfg))
    assert args[3:] == (4, 1, 64, cfg.page_size)


def test_block_table_view_builders_do_not_mutate():
    base = BlockTableView(torch.zeros(2, 4, dtype=torch.int32), torch.ones(2), torch.ones(2))
    longer = base.with_seq_lens(torch.full((2,), 5), torch.full((2,), 5))
    assert base.max_seq_len() == 1
    assert longer.max_seq_len() == 5


def test_fold_host_updates():
    meta = _meta(2)
    updates = [RequestUpdate(0, torch.tensor(2), 2), RequestUpdate(1, torch.tensor(0), 0)]
    folded = fold_host_updates(meta, updates)
    assert folded.seq_lens_cpu.tolist() == [3, 1]
    assert meta.seq_lens_cpu.tolist() == [1, 1]


@requires_cuda
def test_device_metadata_roundtrip():
    meta = _meta(4, device="cuda")
    torch.cuda.synchronize()
    assert meta.kv_indptr.tolist() == [0, 1, 2, 3, 4]  # ok: FC101


@requires_cuda
def test_trtllm_overflow_decode_runs():
    cfg = EngineConfig(num_qo_heads=8, num_kv_heads=2, head_dim=128, max_num_reqs=4, max_seq_len=256)
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    kv = torch.randn(8, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(4, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(8, dtype=torch.int32, device="cuda").view(4, 2)
    seq_lens = torch.full((4,), 20, dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, 32, cfg.head_dim ** -0.5, 1.0)
    assert out.shape == q.shape


def test_request_seq_len():
    r = Request("r0", [1, 2, 3], output_ids=[4])
    assert r.seq_len == 4 and r.num_new_tokens == 4
