"""GPU tests: hook installation, the eager plans the pre-hooks make, and the raw trtllm-gen decode."""

import math

import pytest
import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from hookmeta.config import EngineConfig
from hookmeta.forward_batch import ForwardMode
from hookmeta.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

SMALL = EngineConfig(
    num_layers=2, hidden_size=256, intermediate_size=512, num_qo_heads=4, num_kv_heads=2, head_dim=64,
    vocab_size=1000, max_batch_size=8, max_num_tokens=256, max_context_len=512, decode_buckets=(1, 2, 4, 8),
    enable_cuda_graph=False,
)


def test_hooks_install_and_remove():
    runner = ModelRunner(SMALL)
    assert runner.hooks.installed  # ok: FC109
    runner.shutdown()
    assert not runner.hooks.installed


def test_prefill_plan_on_device_indptr():
    ws = torch.zeros(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchPrefillWithPagedKVCacheWrapper(ws, "HND")
    qo_indptr = torch.tensor([0, 4], dtype=torch.int32, device="cuda")
    kv_indptr = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    last = torch.tensor([4], dtype=torch.int32, device="cuda")
    indices = torch.zeros(1, dtype=torch.int32, device="cuda")
    w.plan(qo_indptr, kv_indptr, indices, last, 4, 2, 64, 16, causal=True)  # ok: FC102
    assert w._plan_info is not None  # ok: FC103


def test_prefill_step_counts_plans():
    runner = ModelRunner(SMALL)
    runner.execute_step([[1, 2, 3]], [3], [[0]], ForwardMode.EXTEND)
    assert runner.hooks._plan_info["extend"] == 1


def test_raw_trtllm_decode_matches_shape():
    bs, pages = 2, 4
    q = torch.randn(bs, 4, 64, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(pages, 2, 2, 16, 64, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(pages, dtype=torch.int32, device="cuda").view(bs, -1)
    seq_lens = torch.tensor([20, 32], dtype=torch.int32, device="cuda")
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(
        q, kv, ws, block_tables, seq_lens, 32, bmm1_scale=1.0 / math.sqrt(64), bmm2_scale=1.0
    )
    assert out.shape == q.shape
