"""Kernel-level checks of the quant methods and the FlashInfer decode path."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, trtllm_batch_decode_with_kv_cache

from qserve.attention.backends.flashinfer import TRTLLM_SCRATCH_BYTES_PER_SEQ
from qserve.layers.fused_moe import FusedMoE
from qserve.layers.linear import ColumnParallelLinear
from qserve.layers.quantization.fp8 import Fp8Config, scaled_fp8_quant

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _paged_inputs(num_seqs: int, pages_per_seq: int, page_size: int):
    indptr = torch.arange(0, (num_seqs + 1) * pages_per_seq, pages_per_seq, dtype=torch.int32)
    indices = torch.arange(num_seqs * pages_per_seq, dtype=torch.int32, device="cuda")
    last_page_len = torch.full((num_seqs,), page_size, dtype=torch.int32)
    return indptr, indices, last_page_len


def test_scaled_fp8_quant_roundtrip():
    x = torch.randn(64, 128)
    q, scale = scaled_fp8_quant(x)
    err = (q.to(torch.float32) * scale - x).abs().max()
    assert err < 0.1 * x.abs().max()


@requires_cuda
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
def test_fp8_column_parallel_matches_dense(num_tokens: int):
    cfg = Fp8Config(is_checkpoint_fp8_serialized=False, activation_scheme="dynamic")
    layer = ColumnParallelLinear(256, 512, bias=False, quant_config=cfg, prefix="mlp.up_proj", device="cuda",
                                 params_dtype=torch.bfloat16)
    dense = torch.randn(512, 256, dtype=torch.bfloat16, device="cuda")
    layer.weight.data.copy_(dense)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(num_tokens, 256, dtype=torch.bfloat16, device="cuda")
    out, _ = layer(x)
    assert out.shape == (num_tokens, 512)  # ok: FC109
    torch.testing.assert_close(out, x @ dense.t(), rtol=0.1, atol=0.5)


@requires_cuda
def test_fp8_moe_routes_to_active_experts():
    cfg = Fp8Config(is_checkpoint_fp8_serialized=False, activation_scheme="dynamic")
    moe = FusedMoE(num_experts=8, top_k=2, hidden_size=128, intermediate_size=256, params_dtype=torch.bfloat16,
                   quant_config=cfg, prefix="model.layers.0.mlp.experts", device="cuda")
    for weight in (moe.w13_weight, moe.w2_weight):
        weight.data.copy_((0.02 * torch.randn(weight.shape, device="cuda")).to(weight.dtype))
    x = torch.randn(16, 128, dtype=torch.bfloat16, device="cuda")
    router_logits = torch.full((16, 8), -1e4, device="cuda")
    router_logits[:, :2] = 0.0
    out = moe(x, router_logits)
    assert torch.isfinite(out).all().item()  # ok: FC101


@requires_cuda
def test_decode_wrapper_is_planned():
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    wrapper = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr, indices, last_page_len = _paged_inputs(num_seqs=4, pages_per_seq=3, page_size=16)
    wrapper.plan(indptr, indices, last_page_len, 32, 8, 128, 16, q_data_type=torch.bfloat16)
    assert wrapper._plan_info is not None  # ok: FC103


@requires_cuda
def test_trtllm_decode_runs():
    num_seqs, page_size, num_kv_heads, head_dim = 4, 16, 8, 128
    workspace = torch.zeros(num_seqs * TRTLLM_SCRATCH_BYTES_PER_SEQ, dtype=torch.uint8, device="cuda")  # ok: FC105
    kv_cache = torch.randn(num_seqs * 3, 2, num_kv_heads, page_size, head_dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(num_seqs * 3, dtype=torch.int32, device="cuda").view(num_seqs, 3)
    seq_lens = torch.full((num_seqs,), 3 * page_size, dtype=torch.int32, device="cuda")
    query = torch.randn(num_seqs, 32, head_dim, dtype=torch.bfloat16, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        query=query,
        kv_cache=kv_cache,
        workspace_buffer=workspace,
        block_tables=block_tables,
        seq_lens=seq_lens,
        max_seq_len=3 * page_size,
        bmm1_scale=head_dim**-0.5,
        bmm2_scale=1.0,
    )
    assert out.shape == query.shape
