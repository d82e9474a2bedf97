"""GPU tests of the module-buffer graph inputs and the wrappers bound to them."""

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from modserve.config import PAGE_SIZE, EngineConfig
from modserve.layers.buffers import GraphInputBuffers
from modserve.runtime.hooks import refresh_layer_meta

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

TEST_WS_BYTES = 64 << 20


def _small_cfg() -> EngineConfig:
    return EngineConfig(num_layers=2, num_qo_heads=8, num_kv_heads=2, head_dim=64, max_num_reqs=8,
                        max_num_tokens=64, max_context_len=256)


def test_buffers_follow_module_to():
    bufs = GraphInputBuffers(max_bs=4, max_pages=32, max_tokens=16).to("cuda")
    for name, buf in bufs.named_buffers():
        assert buf.is_cuda, name  # ok: FC109
    assert int(bufs.kv_last_page_len.sum().item()) == 4  # ok: FC101


def test_plan_from_device_buffers_matches_host():
    cfg = _small_cfg()
    bufs = GraphInputBuffers(cfg.max_num_reqs, 64, cfg.max_num_tokens).to("cuda")
    bufs.kv_indptr[:3].copy_(torch.tensor([0, 2, 5], dtype=torch.int32))
    ws = torch.zeros(TEST_WS_BYTES, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(bufs.kv_indptr[:3], bufs.kv_indices[:5], bufs.kv_last_page_len[:2],  # ok: FC102
           cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, PAGE_SIZE)
    assert w._plan_info is not None  # ok: FC103


def test_eager_wrapper_replays_capture_time_plan():
    """Documents why the engine captures only graph-mode wrappers: an eager wrapper
    captured into a graph keeps the plan it had at capture."""
    cfg = _small_cfg()
    ws = torch.zeros(TEST_WS_BYTES, dtype=torch.uint8, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    w.plan(indptr, torch.zeros(1, dtype=torch.int32, device="cuda"), torch.ones(1, dtype=torch.int32),
           cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, PAGE_SIZE)
    q = torch.randn(1, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(4, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    ref = w.run(q, kv)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = w.run(q, kv)  # ok: FC108
    g.replay()
    torch.testing.assert_close(out, ref)


def test_trtllm_decode_fresh_workspace():
    cfg = _small_cfg()
    q = torch.randn(2, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, cfg.num_kv_heads, PAGE_SIZE, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    seq_lens = torch.tensor([17, 40], dtype=torch.int32, device="cuda")
    ws = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, block_tables, seq_lens, 64, bmm1_scale=0.125, bmm2_scale=1.0)
    zeroed = torch.zeros(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device="cuda")  # ok: FC105
    ref = trtllm_batch_decode_with_kv_cache(q, kv, zeroed, block_tables, seq_lens, 64, bmm1_scale=0.125, bmm2_scale=1.0)
    torch.testing.assert_close(out, ref)


def test_refresh_layer_meta_counts_tokens():
    from modserve.batch import ForwardBatch
    from modserve.layers.attention import PagedAttention

    layer = PagedAttention(0, 8, 2, 64).cuda()
    seq = torch.tensor([3, 5], dtype=torch.int32)
    fb = ForwardBatch(batch_size=2, input_ids=torch.zeros(2, dtype=torch.int64, device="cuda"),
                      positions=torch.tensor([2, 4], device="cuda"), seq_lens=seq.cuda(), seq_lens_cpu=seq,
                      req_pool_indices=torch.tensor([0, 1], device="cuda"),
                      out_cache_loc=torch.tensor([2, 20], device="cuda"))
    refresh_layer_meta(layer, fb=fb)
    assert layer.step_meta.num_kv_tokens == 8
