"""Tests of the FlashInfer compatibility layer (run on both supported release lines in CI)."""

import pytest
import torch

from compatserve import compat
from compatserve.attention import planning
from compatserve.config import EngineConfig

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _cfg() -> EngineConfig:
    return EngineConfig(model_path="dummy", num_layers=2, max_batch_size=8, max_context_len=2048)


def test_filter_drops_unknown_plan_keywords():
    ws = torch.empty(16 << 20, dtype=torch.uint8)  # ok: FC106
    w = compat.make_decode_wrapper(ws, "NHD")
    kw = planning.decode_plan_kwargs(_cfg(), torch.zeros(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    kw["definitely_not_a_plan_arg"] = 1
    filtered = compat.filter_plan_kwargs(w, kw)
    assert "definitely_not_a_plan_arg" not in filtered  # ok: FC109
    assert set(filtered) <= compat.plan_params(w)


def test_split_kv_keywords_follow_the_signature():
    kw = planning.add_split_kv_kwargs({}, frozenset({"fixed_split_size"}), 4096, _cfg())
    assert kw["fixed_split_size"] >= planning.MIN_SPLIT_PAGES


@requires_cuda
def test_gather_kv_indices_matches_a_python_loop():
    dev = torch.device("cuda")
    req_to_page = torch.arange(4 * 8, dtype=torch.int32, device=dev).view(4, 8)
    pool = torch.tensor([2, 0], device=dev)
    counts = torch.tensor([3, 2], device=dev)
    indptr = torch.tensor([0, 3, 5], dtype=torch.int32, device=dev)
    out = torch.zeros(8, dtype=torch.int32, device=dev)
    planning.gather_kv_indices(req_to_page, pool, counts, None, indptr, 5, out)
    assert out[:5].tolist() == [16, 17, 18, 0, 1]
    assert out[0].item() == 16  # ok: FC101


@requires_cuda
@pytest.mark.skipif(compat.trtllm_batch_decode_with_kv_cache is None, reason="no trtllm-gen kernels")
def test_trtllm_decode_runs_with_a_zeroed_workspace():
    dev = torch.device("cuda")
    bs, heads, kv_heads, dim, page, pages = 4, 16, 4, 128, 16, 64
    workspace = torch.zeros(bs * heads * dim * 4 * 8 + (8 << 20), dtype=torch.uint8, device=dev)  # ok: FC105
    q = torch.randn(bs, heads, dim, dtype=torch.bfloat16, device=dev)
    kv = torch.randn(pages, 2, kv_heads, page, dim, dtype=torch.bfloat16, device=dev)
    block_tables = torch.arange(bs * 4, dtype=torch.int32, device=dev).view(bs, 4)
    seq_lens = torch.full((bs,), 50, dtype=torch.int32, device=dev)
    out = compat.trtllm_batch_decode_with_kv_cache(
        query=q, kv_cache=kv, workspace_buffer=workspace, block_tables=block_tables,
        seq_lens=seq_lens, max_seq_len=64, bmm1_scale=dim ** -0.5, bmm2_scale=1.0,
    )
    torch.cuda.synchronize()
    assert torch.isfinite(out).all()


def test_version_flags_are_consistent():
    if compat.PLAN_RUN_API:
        assert compat.flashinfer_at_least("0.2.0")
    else:
        assert compat.fast_decode_plan is None
