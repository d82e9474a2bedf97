"""Backend composition: base orders, registry, and the FA2 decode path against a reference."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from mroserve.config import EngineConfig
from mroserve_attn.backends import (
    CascadeGraphBackend,
    DraftGraphBackend,
    FlashInferBackend,
    FlashInferGraphBackend,
    TrtllmGraphBackend,
)
from mroserve_attn.base import AttentionBackend
from mroserve_attn.mixins.cascade import CascadeMixin
from mroserve_attn.mixins.graph_buffers import GraphBuffersMixin
from mroserve_attn.mixins.sliding_window import SlidingWindowMixin
from mroserve_attn.mixins.spec_decode import SpecDecodeMixin

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _names(cls):
    return [c.__name__ for c in cls.__mro__]


def test_graph_mixin_comes_before_window_mixin():
    assert _names(FlashInferGraphBackend)[:4] == [
        "FlashInferGraphBackend",
        "GraphBuffersMixin",
        "SlidingWindowMixin",
        "FlashInferBackend",
    ]


def test_draft_backend_puts_window_mixin_first():
    mro = DraftGraphBackend.__mro__
    assert mro.index(SpecDecodeMixin) < mro.index(SlidingWindowMixin) < mro.index(GraphBuffersMixin)


def test_cascade_extend_is_the_paged_prefill():
    assert CascadeGraphBackend.forward_extend is FlashInferBackend.forward_extend
    assert CascadeGraphBackend.forward_decode is CascadeMixin.forward_decode


@pytest.mark.parametrize(
    "cls,expected",
    [(FlashInferGraphBackend, "fa2"), (TrtllmGraphBackend, "trtllm-gen"), (DraftGraphBackend, "fa2")],
)
def test_decode_backend_resolution(cls, expected):
    assert cls.decode_backend == expected  # ok: FC109


def test_registry():
    assert AttentionBackend.registry["flashinfer_graph"] is FlashInferGraphBackend
    assert "draft" not in AttentionBackend.registry
    assert DraftGraphBackend.supports_cuda_graph and not FlashInferBackend.supports_cuda_graph


@needs_cuda
def test_fa2_decode_matches_reference():
    cfg = EngineConfig(num_qo_heads=4, num_kv_heads=4, head_dim=64, num_pages=8)
    ws = torch.empty(32 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC105, FC106
    wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda")
    indices = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
    last = torch.tensor([5, 16], dtype=torch.int32, device="cuda")
    wrapper.plan(indptr, indices, last, 4, 4, 64, cfg.page_size, q_data_type=torch.float16)  # ok: FC102
    kv = torch.randn(cfg.num_pages, 2, cfg.page_size, 4, 64, dtype=torch.float16, device="cuda")
    q = torch.randn(2, 4, 64, dtype=torch.float16, device="cuda")
    out = wrapper.run(q, kv)

    k0 = kv[0, 0, :5]
    v0 = kv[0, 1, :5]
    scores = torch.einsum("hd,thd->ht", q[0].float(), k0.float()) / 8.0
    ref = torch.einsum("ht,thd->hd", scores.softmax(-1), v0.float())
    err = (out[0].float() - ref).abs().max().item()  # ok: FC101
    assert err < 2e-2
