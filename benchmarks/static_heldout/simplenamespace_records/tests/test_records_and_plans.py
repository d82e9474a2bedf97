"""Unit tests of the record helpers and of a few FlashInfer plans driven through them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from nsattn.plan_kwargs import decode_plan_kwargs, static_decode_kwargs
from nsserve.config import load_config, to_namespace
from nsserve.records import as_kwargs, copy_record, make_meta, make_record, update_record

TEST_WORKSPACE_BYTES = 128 * 1024 * 1024

HF = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "vocab_size": 1000,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


def _cfg(**overrides):
    return to_namespace(load_config(HF, overrides, environ={}))


def test_make_record_roundtrip():
    rec = make_record(mode="decode", batch_size=2, seq_lens_cpu=torch.tensor([3, 5]))
    meta = make_meta(**vars(rec))
    assert meta.wrapper is None and meta.batch_size == 2  # ok: FC109
    assert as_kwargs(meta, keep=("mode",)) == {"mode": "decode"}
    twin = copy_record(rec, batch_size=3)
    assert twin.batch_size == 3 and rec.batch_size == 2


def test_update_record_overwrites():
    rec = update_record(SimpleNamespace(mode="decode"), mode="extend", num_tokens=7)
    assert vars(rec) == {"mode": "extend", "num_tokens": 7}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_decode_plan_from_device_record():
    cfg = _cfg(page_size=16)
    ws = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    rec = make_record(
        mode="decode",
        kv_indptr=torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda"),
        kv_indices=torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda"),
        kv_last_page_len=torch.tensor([4, 16], dtype=torch.int32, device="cuda"),
    )
    w.plan(  # ok: FC102
        **decode_plan_kwargs(cfg, indptr=rec.kv_indptr, indices=rec.kv_indices, last_page_len=rec.kv_last_page_len)
    )
    assert w._plan_info is not None  # ok: FC103
    assert rec.kv_indptr[-1].item() == 3  # ok: FC101


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_eager_wrapper_replays_its_capture_plan():
    cfg = _cfg()
    w = BatchDecodeWithPagedKVCacheWrapper(torch.zeros(64 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    w.plan(
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([0], dtype=torch.int32, device="cuda"),
        torch.tensor([1], dtype=torch.int32),
        **static_decode_kwargs(cfg),
    )
    q = torch.randn(1, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.torch_dtype, device="cuda")
    kv = torch.randn(2, 16, cfg.num_kv_heads, cfg.head_dim, dtype=cfg.torch_dtype, device="cuda")
    ref = w.run(q, (kv, kv))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, (kv, kv))  # ok: FC108
    g.replay()
    torch.testing.assert_close(out, ref)


def _trtllm_inputs(cfg):
    q = torch.randn(2, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.torch_dtype, device="cuda")
    kv = torch.randn(4, 2, cfg.num_kv_heads, 16, cfg.head_dim, dtype=cfg.torch_dtype, device="cuda")
    block_tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([20, 31], dtype=torch.int32, device="cuda")
    return q, kv, block_tables, seq_lens


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trtllm_decode_fresh_workspace():
    cfg = _cfg(decode_backend="trtllm-gen")
    q, kv, bt, lens = _trtllm_inputs(cfg)
    ws = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 64, bmm1_scale=cfg.head_dim**-0.5, bmm2_scale=1.0)
    assert out.shape == q.shape


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trtllm_decode_zeroed_workspaces():
    cfg = _cfg(decode_backend="trtllm-gen")
    q, kv, bt, lens = _trtllm_inputs(cfg)
    zeroed = torch.zeros(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    scrubbed = torch.empty(TEST_WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC105
    scrubbed.zero_()
    for ws in (zeroed, scrubbed):
        out = trtllm_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 64, bmm1_scale=cfg.head_dim**-0.5, bmm2_scale=1.0)
        assert torch.isfinite(out).all()
