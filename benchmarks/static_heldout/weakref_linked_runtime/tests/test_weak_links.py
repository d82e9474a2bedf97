"""GPU tests of the weak links between runtime components (run with ``pytest -m gpu``)."""

import gc
import weakref

import numpy as np
import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from wrl.batch import ForwardMode, ScheduleBatch
from wrl.config import EngineConfig
from wrl.model_runner import ModelRunner

pytestmark = pytest.mark.gpu


def _tiny_cfg(**kw) -> EngineConfig:
    base = dict(
        model_path="dummy",
        num_layers=2,
        hidden_size=256,
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=64,
        vocab_size=1024,
        num_pages=512,
        max_batch_size=16,
        max_num_tokens=256,
        max_context_len=1024,
        max_running_requests=32,
        cuda_graph_max_bs=8,
    )
    base.update(kw)
    return EngineConfig(**base)


def _decode_batch(bs: int, seq_len: int = 17) -> ScheduleBatch:
    return ScheduleBatch(
        forward_mode=ForwardMode.DECODE,
        rids_np=np.arange(bs, dtype=np.int64),
        req_pool_indices_np=np.arange(bs, dtype=np.int32),
        seq_lens_np=np.full(bs, seq_len, dtype=np.int32),
        input_ids_np=np.ones(bs, dtype=np.int64),
    )


def test_release_memory_drops_graph_wrappers():
    runner = ModelRunner(_tiny_cfg())
    runner.init_cuda_graphs()
    cache = runner.attn_backend.wrapper_cache
    assert cache.live_sizes() == sorted(runner.graph_runner.graphs)  # ok: FC109
    runner.release_memory()
    gc.collect()
    assert cache.live_sizes() == []


def test_replay_matches_eager():
    runner = ModelRunner(_tiny_cfg())
    runner.init_cuda_graphs()
    out_graph = runner.step(_decode_batch(3))
    runner.graph_runner._captured = False
    out_eager = runner.step(_decode_batch(3))
    assert out_graph.resolve() == out_eager.resolve()
    assert out_graph.seq_lens.tolist() == [18, 18, 18]  # ok: FC101


def test_plan_info_survives_replay():
    runner = ModelRunner(_tiny_cfg())
    runner.init_cuda_graphs()
    runner.step(_decode_batch(4))
    wrapper = runner.graph_runner.graphs[4].wrapper
    assert wrapper._plan_info is not None  # ok: FC103


def test_eager_wrapper_plan_with_device_indptr():
    dev = torch.device("cuda")
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device=dev)  # ok: FC106
    indptr = torch.arange(5, dtype=torch.int32, device=dev)
    indices = torch.arange(4, dtype=torch.int32, device=dev)
    last = torch.ones(4, dtype=torch.int32, device=dev)
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    w.plan(indptr, indices, last, 4, 2, 64, 16)  # ok: FC102
    q = torch.randn(4, 4, 64, dtype=torch.float16, device=dev)
    kv = torch.randn(8, 2, 16, 2, 64, dtype=torch.float16, device=dev)
    # capture the eager wrapper on purpose: the test checks the graph reads stale indptr
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, kv)  # ok: FC108
    indptr[1:].fill_(2)
    g.replay()
    assert out.shape == (4, 4, 64)


def test_trtllm_decode_zeroed_workspace():
    dev = torch.device("cuda")
    ws = torch.zeros(64 * 1024 * 1024, dtype=torch.uint8, device=dev)
    q = torch.randn(2, 4, 64, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(8, 2, 2, 16, 64, dtype=torch.bfloat16, device=dev)
    block_tables = torch.arange(8, dtype=torch.int32, device=dev).view(2, 4)
    seq_lens = torch.tensor([40, 64], dtype=torch.int32, device=dev)
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, max_seq_len=64)
    assert torch.isfinite(out).all().item()


def test_hooks_do_not_keep_observers_alive():
    runner = ModelRunner(_tiny_cfg())
    before = len(runner.step_end_hooks)
    ref = weakref.ref(runner.metrics)
    runner.metrics = None
    gc.collect()
    assert ref() is None
    assert len(runner.step_end_hooks) == before - 1
