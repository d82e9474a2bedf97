"""Tests of the cached resource factories and the trtllm-gen path (need a CUDA device)."""
import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from lrcserve import resources
from lrcserve.config import EngineConfig

# small enough for the 4-row batches below
WS_BYTES = 32 * 1024 * 1024

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def device():
    return torch.device("cuda", 0)


@pytest.fixture
def small_cfg():
    return EngineConfig(model_path="dummy", num_layers=1, num_pages=64, max_batch_size=4, capture_sizes=(1, 2, 4))


def test_factories_are_cached_and_cleared(device):
    first = resources.decode_workspace(device)
    assert resources.decode_workspace(device) is first  # ok: FC109
    resources.rebuild_all()
    assert resources.decode_workspace.cache_info().currsize == 0


def test_fa2_decode_runs_on_small_workspace(device):
    workspace = torch.zeros(WS_BYTES, dtype=torch.uint8, device=device)  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    indices = torch.tensor([0, 1], dtype=torch.int32, device=device)
    last = torch.tensor([3, 5], dtype=torch.int32, device=device)
    w.plan(indptr, indices, last, 8, 8, 128, 16, q_data_type=torch.bfloat16)
    q = torch.randn(2, 8, 128, dtype=torch.bfloat16, device=device)
    kv = torch.randn(2, 2, 16, 8, 128, dtype=torch.bfloat16, device=device)
    assert w.run(q, kv).shape == q.shape


def test_trtllm_decode_zeroed_workspace(device, small_cfg):
    workspace = torch.empty(small_cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
    workspace.zero_()
    q = torch.randn(4, small_cfg.num_qo_heads, small_cfg.head_dim, dtype=torch.bfloat16, device=device)
    shape = (8, small_cfg.num_kv_heads, small_cfg.page_size, small_cfg.head_dim)
    kv = (torch.randn(shape, dtype=torch.bfloat16, device=device), torch.randn(shape, dtype=torch.bfloat16, device=device))
    block_tables = torch.arange(8, dtype=torch.int32, device=device).view(4, 2)
    seq_lens = torch.tensor([5, 17, 32, 9], dtype=torch.int32, device=device)
    out = trtllm_batch_decode_with_kv_cache(
        query=q, kv_cache=kv, workspace_buffer=workspace, block_tables=block_tables,
        seq_lens=seq_lens, max_seq_len=32, bmm1_scale=small_cfg.head_dim ** -0.5, bmm2_scale=1.0,
    )
    assert torch.isfinite(out.float().cpu()).all()
