"""GPU tests for the plan helpers and the decode kernels opserve uses."""

from __future__ import annotations

import functools
import operator

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from opserve.attention.planner import PlanCache, pages_per_request
from opserve.batch import ForwardMode, ScheduledRequest, build_step_batch, seq_lens_of

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

NUM_QO, NUM_KV, HEAD_DIM, PAGE = 32, 8, 128, 16


def _paged_kv(num_pages: int):
    shape = (num_pages, PAGE, NUM_KV, HEAD_DIM)
    return tuple(torch.randn(shape, dtype=torch.bfloat16, device="cuda") for _ in range(2))


def test_pages_per_request():
    lens = torch.tensor([1, 16, 17, 0], dtype=torch.int32)
    assert pages_per_request(lens, PAGE).tolist() == [1, 1, 2, 0]  # ok: FC109


def test_plan_cache_roundtrip():
    cache = PlanCache()
    cache.record(8, (5, 40))
    assert cache.unchanged(8, (5, 40))
    assert not cache.unchanged(8, (6, 40))


@requires_gpu
def test_build_step_batch_moves_lengths_to_device():
    reqs = [ScheduledRequest(f"r{i}", [7], 15 + i, i, [i, 100 + i], 0.0) for i in range(4)]
    batch = build_step_batch(reqs, ForwardMode.DECODE, PAGE, torch.device("cuda"))
    assert seq_lens_of(batch).is_cuda
    assert seq_lens_of(batch).max().item() == 19  # ok: FC101


@requires_gpu
def test_trtllm_decode_matches_fa2():
    bs, pages_per_req = 4, 3
    kv = _paged_kv(bs * pages_per_req)
    q = torch.randn(bs, NUM_QO, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(bs * pages_per_req, dtype=torch.int32, device="cuda").view(bs, pages_per_req)
    seq_lens = torch.full((bs,), pages_per_req * PAGE, dtype=torch.int32, device="cuda")
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(
        q, kv, ws, block_tables, seq_lens, max_seq_len=pages_per_req * PAGE, bmm1_scale=HEAD_DIM**-0.5, bmm2_scale=1.0
    )

    fa2_ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ref_wrapper = BatchDecodeWithPagedKVCacheWrapper(fa2_ws, "HND", backend="fa2")
    indptr = torch.arange(0, bs * pages_per_req + 1, pages_per_req, dtype=torch.int32)
    ref_wrapper.plan(  # ok: FC102
        indptr.cuda(),
        block_tables.flatten(),
        torch.full((bs,), PAGE, dtype=torch.int32),
        NUM_QO,
        NUM_KV,
        HEAD_DIM,
        PAGE,
        q_data_type=torch.bfloat16,
    )
    ref = ref_wrapper.run(q, kv)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


@requires_gpu
def test_eager_wrapper_in_graph_reads_capture_plan():
    """Documents why the engine binds graph wrappers: an eager wrapper replays its capture-time plan."""
    bs = 2
    kv = _paged_kv(4)
    q = torch.randn(bs, NUM_QO, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    plan = functools.partial(w.plan, num_qo_heads=NUM_QO, num_kv_heads=NUM_KV, head_dim=HEAD_DIM, page_size=PAGE)
    plan(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32, device="cuda"),
         torch.ones(bs, dtype=torch.int32))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = operator.methodcaller("run", q, kv)(w)  # ok: FC108
    graph.replay()
    assert out.shape == (bs, NUM_QO, HEAD_DIM)
