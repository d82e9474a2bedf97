"""Registry checks and kernel smoke tests for the backends the engine can pick (the kernel tests need a GPU)."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

import ccbi_attn.flashinfer_backend  # noqa: F401
import ccbi_attn.mla_backend  # noqa: F401
from ccbi.config import EngineConfig
from ccbi_attn.base import AttentionBackend

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_every_backend_registered_once():
    names = set(AttentionBackend.registry)
    assert names == {"flashinfer", "trtllm_gen", "flashinfer_cascade", "flashinfer_mla"}, names  # ok: FC109
    assert all(cls.name == n for n, cls in AttentionBackend.registry.items())  # ok: FC109


def test_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="registered"):
        AttentionBackend.create(EngineConfig(attention_backend="xformers"), torch.device("cpu"), None)


@gpu
def test_fa2_and_trtllm_gen_decode_agree():
    fa2_ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    trt_ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    fa2 = BatchDecodeWithPagedKVCacheWrapper(fa2_ws, "NHD")
    trt = BatchDecodeWithPagedKVCacheWrapper(trt_ws, "NHD", backend="trtllm-gen")
    kv_indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device="cuda")
    indices = torch.arange(3, dtype=torch.int32, device="cuda")
    last = torch.tensor([16, 5], dtype=torch.int32)
    fa2.plan(kv_indptr, indices, last, 32, 8, 128, 16)  # ok: FC102
    trt.plan(kv_indptr.cpu(), indices, last, 32, 8, 128, 16)
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(3, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    err = (fa2.run(q, kv) - trt.run(q, kv)).abs().max().item()  # ok: FC101
    assert err < 2e-2, err  # ok: FC109


@gpu
def test_prefill_wrappers_on_engine_shapes():
    ragged_ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    paged_ws = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    trt_ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    trt_ws.zero_()
    ragged = BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "NHD")
    paged = BatchPrefillWithPagedKVCacheWrapper(paged_ws, "NHD")
    trt = BatchPrefillWithPagedKVCacheWrapper(trt_ws, "NHD", backend="trtllm-gen")
    qo = torch.tensor([0, 7, 12], dtype=torch.int32)
    ragged.plan(qo, qo, 32, 8, 128, causal=True)
    for w in (paged, trt):
        w.plan(qo, torch.tensor([0, 1, 2], dtype=torch.int32), torch.arange(2, dtype=torch.int32, device="cuda"),
               torch.tensor([7, 5], dtype=torch.int32), 32, 8, 128, 16, causal=True)
    q = torch.randn(12, 32, 128, dtype=torch.bfloat16, device="cuda")
    k, v = torch.randn(2, 12, 8, 128, dtype=torch.bfloat16, device="cuda").unbind(0)
    kv = torch.randn(2, 2, 16, 8, 128, dtype=torch.bfloat16, device="cuda")
    assert ragged.run(q, k, v).shape == q.shape  # ok: FC109
    assert torch.isfinite(paged.run(q, kv)).all() and torch.isfinite(trt.run(q, kv)).all()  # ok: FC109
