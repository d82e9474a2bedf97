"""Resolution of the qualified-name tables, and the trtllm-gen kernel module on a Blackwell GPU."""

import flashinfer
import pytest
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from qrserve.config import ATTENTION_PLUGINS, KV_HELPERS, MODEL_REGISTRY, QUALNAMES
from qrserve.utils import get_kv_helper_cls, load_plugin, resolve_obj_by_qualname

_COMPONENTS = ("graph_wrapper", "sampler", "graph_workspace")

requires_sm100 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 10, reason="needs a Blackwell GPU"
)


@pytest.mark.parametrize("platform", sorted(QUALNAMES))
@pytest.mark.parametrize("mode", ["graph", "eager"])
def test_platform_table_resolves(platform, mode):
    table = QUALNAMES[platform][mode]
    for key in _COMPONENTS:
        assert callable(resolve_obj_by_qualname(table[key])), key
    if table["decode_kernel"] is not None:
        import importlib

        assert hasattr(importlib.import_module(table["decode_kernel"]), "decode")


def test_backend_and_helpers_resolve():
    from qrserve.attention.flashinfer import FlashInferBackend, FlashInferMetadataBuilder

    cls = resolve_obj_by_qualname("qrserve.attention.flashinfer.FlashInferBackend")
    assert cls is FlashInferBackend  # ok: FC109
    assert cls.get_builder_cls() is FlashInferMetadataBuilder
    for arch in MODEL_REGISTRY.values():
        assert isinstance(resolve_obj_by_qualname(arch), type)
    for name in KV_HELPERS:
        assert isinstance(get_kv_helper_cls(name), type)
    for spec in ATTENTION_PLUGINS.values():
        assert load_plugin(spec).plugin_name


def _paged_decode_inputs(batch: int, heads: int = 32, kv_heads: int = 8, dim: int = 128, page: int = 16):
    seq_lens = torch.randint(1, 2048, (batch,), dtype=torch.int32, device="cuda")
    max_pages = 2048 // page
    block_tables = torch.arange(batch * max_pages, dtype=torch.int32, device="cuda").view(batch, max_pages)
    kv_cache = torch.randn(batch * max_pages, 2, kv_heads, page, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, heads, dim, dtype=torch.bfloat16, device="cuda")
    return q, kv_cache, block_tables, seq_lens


@requires_sm100
def test_trtllm_decode_fresh_workspace():
    q, kv_cache, block_tables, seq_lens = _paged_decode_inputs(64)
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    max_seq_len = seq_lens.max().item()  # ok: FC101
    out = trtllm_batch_decode_with_kv_cache(
        q, kv_cache, workspace, block_tables, seq_lens, max_seq_len, bmm1_scale=q.shape[-1] ** -0.5, bmm2_scale=1.0
    )
    assert torch.isfinite(out).all()


@requires_sm100
def test_trtllm_decode_zeroed_workspace():
    q, kv_cache, block_tables, seq_lens = _paged_decode_inputs(64)
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    out = trtllm_batch_decode_with_kv_cache(
        q, kv_cache, workspace, block_tables, seq_lens, 2048, bmm1_scale=q.shape[-1] ** -0.5, bmm2_scale=1.0
    )
    assert out.shape == q.shape


def test_fa2_decode_on_fresh_workspace():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    batch, heads, kv_heads, dim, page = 8, 32, 8, 128, 16
    pages_per_req = 4
    workspace = torch.empty(batch * heads * (dim + 1) * 4 * 16, dtype=torch.uint8, device="cuda")  # ok: FC105
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr = torch.arange(0, (batch + 1) * pages_per_req, pages_per_req, dtype=torch.int32)
    indices = torch.arange(batch * pages_per_req, dtype=torch.int32, device="cuda")
    last_page_len = torch.full((batch,), page, dtype=torch.int32)
    wrapper.plan(indptr, indices, last_page_len, heads, kv_heads, dim, page, q_data_type=torch.bfloat16)
    kv = torch.randn(batch * pages_per_req, 2, page, kv_heads, dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(batch, heads, dim, dtype=torch.bfloat16, device="cuda")
    assert wrapper.run(q, kv).shape == q.shape
