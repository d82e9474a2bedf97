"""GPU tests of the closure factories (skipped without CUDA)."""

from __future__ import annotations

import pytest
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from cfserve.attention import make_decode_attend
from cfserve.batch import Request, dummy_batch, make_batch_builder
from cfserve.config import EngineConfig
from cfserve.instrument import make_step_stats
from cfserve.wrappers import make_graph_wrapper_cache
from cfserve_runtime.engine import pick_bucket
from cfserve_runtime.graphs import init_graph_buffers

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
SMALL = EngineConfig(num_layers=2, hidden_size=256, intermediate_size=512, num_qo_heads=4, num_kv_heads=2,
                     head_dim=64, max_batch_size=8, max_seq_len=512)


def test_pick_bucket_rounds_up():
    assert pick_bucket((1, 2, 4, 8), 3) == 4  # ok: FC109
    assert pick_bucket((1, 2, 4, 8), 9) is None


@cuda
def test_graph_wrapper_cache_reuses_bucket_wrappers():
    dev = torch.device("cuda", 0)
    bufs = init_graph_buffers(SMALL, dev)
    ws = torch.zeros(SMALL.decode_workspace_bytes(), dtype=torch.uint8, device=dev)
    get = make_graph_wrapper_cache(ws, bufs, SMALL.kv_layout)
    assert get(4) is get(4)
    assert get(2) is not get(4)


@cuda
def test_plan_then_run_small_bucket():
    dev = torch.device("cuda", 0)
    bufs = init_graph_buffers(SMALL, dev)
    ws = torch.zeros(SMALL.decode_workspace_bytes(), dtype=torch.uint8, device=dev)
    w = make_graph_wrapper_cache(ws, bufs, SMALL.kv_layout)(2)
    batch = dummy_batch(SMALL, 2, dev)
    w.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, SMALL.num_qo_heads,
           SMALL.num_kv_heads, SMALL.head_dim, SMALL.page_size, q_data_type=SMALL.dtype, kv_data_type=SMALL.dtype)
    assert w._plan_info is not None  # ok: FC103
    kv = torch.randn(4, 2, SMALL.page_size, SMALL.num_kv_heads, SMALL.head_dim, dtype=SMALL.dtype, device=dev)
    q = torch.randn(2, SMALL.num_qo_heads, SMALL.head_dim, dtype=SMALL.dtype, device=dev)
    out = make_decode_attend(w)(q, None, None, kv)
    assert out.shape == q.shape


@cuda
def test_trtllm_decode_with_zeroed_scratch():
    dev = torch.device("cuda", 0)
    ws = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device=dev)  # ok: FC105
    kv = torch.randn(8, 2, SMALL.num_kv_heads, SMALL.page_size, SMALL.head_dim, dtype=SMALL.dtype, device=dev)
    q = torch.randn(2, SMALL.num_qo_heads, SMALL.head_dim, dtype=SMALL.dtype, device=dev)
    block_tables = torch.arange(8, dtype=torch.int32, device=dev).view(2, 4)
    seq_lens = torch.tensor([40, 17], dtype=torch.int32, device=dev)
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, 64, SMALL.head_dim**-0.5, 1.0)
    assert torch.isfinite(out.float()).all()


@cuda
def test_step_stats_count_tokens():
    dev = torch.device("cuda", 0)
    pages = {1: [0, 1], 2: [2]}
    build = make_batch_builder(SMALL, dev, pages.__getitem__)
    batch = build([Request(1, list(range(20))), Request(2, [5, 6, 7])], False)
    record, report = make_step_stats()
    record(batch)
    stats = report()
    assert stats["kv_tokens"] == 23 and stats["peak_len"] == 20
