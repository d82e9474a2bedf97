"""Config merging and a smoke test of the wrappers the config builds (needs a GPU for the last two)."""

import json

import pytest
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from nct_cfg.defaults import DEFAULT_CONFIG
from nct_cfg.loader import get_path, load_config, merge_config


def test_model_override_keeps_other_defaults():
    cfg = load_config(None, "mistral-7b", environ={})
    assert cfg["attention"]["page_size"] == 32  # ok: FC109
    assert cfg["attention"]["workspace_mb"] == DEFAULT_CONFIG["attention"]["workspace_mb"]


def test_json_file_then_env(tmp_path):
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps({"attention": {"workspace_mb": 384}, "cuda_graph": {"batch_sizes": [1, 8]}}))
    cfg = load_config(str(p), None, environ={"NCT_GRAPH_BATCH_SIZES": "1,2,4"})
    assert get_path(cfg, "attention.workspace_mb") == 384
    assert cfg["cuda_graph"]["batch_sizes"] == [1, 2, 4]
    assert merge_config({"a": {"b": 1}}, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_decode_plan_on_device_tensors():
    workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    w = BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    indptr = torch.tensor([0, 2, 5], dtype=torch.int32)
    w.plan(indptr.cuda(), torch.arange(5, dtype=torch.int32, device="cuda"),  # ok: FC102
           torch.tensor([3, 7], dtype=torch.int32), 32, 8, 128, 16)
    info = w._plan_info  # ok: FC103
    assert info is not None
    lens = torch.tensor([19, 71], device="cuda")
    total = lens.sum().item()  # ok: FC101
    assert total == 90


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trtllm_decode_zeroed_workspace():
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    q = torch.randn(2, 32, 128, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(8, 2, 8, 16, 128, dtype=torch.bfloat16, device="cuda")
    block_tables = torch.arange(8, dtype=torch.int32, device="cuda").view(2, 4)
    seq_lens = torch.tensor([40, 64], dtype=torch.int32, device="cuda")
    out = trtllm_batch_decode_with_kv_cache(
        query=q, kv_cache=kv, workspace_buffer=ws, block_tables=block_tables,
        seq_lens=seq_lens, max_seq_len=64, bmm1_scale=128 ** -0.5, bmm2_scale=1.0,
    )
    assert out.shape == q.shape
