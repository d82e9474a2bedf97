import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from agserve.config import EngineConfig
from agserve.ops.attention_fn import PagedDecodeAttention
from agserve.ops.custom_ops import trtllm_paged_decode

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _cfg():
    return EngineConfig(num_layers=1, max_batch_size=4, max_context_len=256, mla_layers=())


def test_paged_decode_function_runs_planned_wrapper():
    cfg = _cfg()
    ws = torch.zeros(cfg.float_workspace_bytes(), dtype=torch.uint8, device="cuda")
    w = BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    kv_indptr = torch.tensor([0, 1, 3], dtype=torch.int32, device="cuda")
    last_page_len = torch.tensor([5, 16], dtype=torch.int32, device="cuda")
    kv_indices = torch.arange(3, dtype=torch.int32, device="cuda")
    # the test plans with device tensors on purpose: the planner must accept both
    w.plan(kv_indptr, kv_indices, last_page_len, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size)
    k = torch.randn(3, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(2, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    seq_lens = torch.tensor([5, 32], dtype=torch.int32, device="cuda")
    out = PagedDecodeAttention.apply(q, k, k, w, seq_lens)
    assert out.isfinite().all()
    assert kv_indptr.tolist() == [0, 1, 3]  # ok: FC109


def test_trtllm_decode_op_with_zeroed_workspace():
    cfg = _cfg()
    workspace = torch.zeros(cfg.trtllm_workspace_bytes(), dtype=torch.uint8, device="cuda")  # ok: FC105
    k = torch.randn(4, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(2, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([20, 31], dtype=torch.int32, device="cuda")
    out = trtllm_paged_decode(q, k, k, workspace, block_tables, seq_lens, cfg.head_dim**-0.5)
    assert out.shape == q.shape
