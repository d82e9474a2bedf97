"""Engine tests: lazy exports, backend selection, and GPU checks of the graph path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import lazyserve
import lazyserve.runtime
from lazyserve.batch import ForwardMode, ScheduledBatch
from lazyserve.config import EngineConfig
from lazyserve.layers.attention import Backend, get_backend_cls
from lazyserve.layers.attention import plan as fi_plan

requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def small_cfg(**overrides) -> EngineConfig:
    base = dict(
        num_layers=2,
        hidden_size=256,
        intermediate_size=512,
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=64,
        vocab_size=1024,
        num_pages=256,
        max_batch_size=8,
        max_num_tokens=256,
        max_context_len=1024,
        cuda_graph_bs=[1, 2, 4, 8],
        sliding_window_layers=(1,),
        sliding_window=64,
    )
    base.update(overrides)
    return EngineConfig(**base)


def decode_batch(seq_lens, page_size=16) -> ScheduledBatch:
    bs = len(seq_lens)
    pages = [(s + page_size - 1) // page_size for s in seq_lens]
    table = np.zeros((bs, max(pages)), dtype=np.int32)
    nxt = 1
    for i, p in enumerate(pages):
        table[i, :p] = np.arange(nxt, nxt + p)
        nxt += p
    return ScheduledBatch(
        forward_mode=ForwardMode.DECODE,
        req_ids=tuple(f"r{i}" for i in range(bs)),
        input_ids=[1] * bs,
        positions=[s - 1 for s in seq_lens],
        seq_lens=list(seq_lens),
        extend_lens=[1] * bs,
        page_table_rows=table,
        out_cache_loc=[int(table[i, pages[i] - 1]) * page_size + (s - 1) % page_size for i, s in enumerate(seq_lens)],
        temperatures=[0.0] * bs,
        top_k=[1] * bs,
        output_lens=[4] * bs,
        min_new_tokens=[0] * bs,
    )


def test_lazy_exports_resolve():
    assert lazyserve.runtime.GraphRunner is lazyserve.CudaGraphRunner  # ok: FC109
    assert lazyserve.Sampler.__module__ == "lazyserve.layers.sampler"
    with pytest.raises(AttributeError):
        lazyserve.NoSuchThing  # noqa: B018


def test_backend_table():
    assert get_backend_cls("flashinfer") is Backend
    assert get_backend_cls("trtllm").__name__ == "TrtllmDecodeBackend"


@requires_gpu
def test_replay_matches_host_mirror():
    runner = lazyserve.ModelRunner(small_cfg())
    out = runner.step(decode_batch([17, 33, 5]))
    out.ready.synchronize()
    torch.cuda.synchronize()  # ok: FC101
    dump = runner.attn_backend.debug_dump(4)
    assert dump["kv_indptr"] == [0, 2, 5, 6, 6]
    assert out.next_token_ids.shape == (3,)


@requires_gpu
def test_plan_decode_accepts_device_indptr():
    ws = torch.zeros(16 << 20, dtype=torch.uint8, device="cuda")
    w = fi_plan.DecodeWrapper(ws, "NHD")
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    last = torch.ones(2, dtype=torch.int32, device="cuda")
    indices = torch.arange(2, dtype=torch.int32, device="cuda")
    fi_plan.plan_decode(w, indptr, indices, last, fi_plan.PlanDims(4, 2, 64, 16))
    w.plan(indptr, indices, last, 4, 2, 64, 16)  # ok: FC102


@requires_gpu
def test_trtllm_decode_kernel_smoke():
    from flashinfer.decode import trtllm_batch_decode_with_kv_cache

    cfg = small_cfg()
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105  # ok: FC106
    q = torch.randn(2, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, cfg.num_kv_heads, 16, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([20, 9], dtype=torch.int32, device="cuda")
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
