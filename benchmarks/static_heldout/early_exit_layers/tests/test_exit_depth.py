import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from eelayers.confidence import ConfidenceHead
from eelayers.config import ExitConfig


def test_depth_per_row_respects_min_depth():
    head = ConfidenceHead(16, 0.5, 4)
    confs = torch.tensor([[0.9, 0.1], [0.9, 0.2], [0.1, 0.95], [0.1, 0.1]], device="cuda")
    d = head.depth_per_row(confs, 2)
    assert d.max().item() == 4  # ok: FC101
    assert d.tolist() == [4, 3]  # ok: FC109


def _inputs(cfg: ExitConfig, bs: int):
    q = torch.randn(bs, cfg.num_qo_heads, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(64, 2, cfg.num_kv_heads, cfg.page_size, cfg.head_dim, dtype=torch.bfloat16, device="cuda")
    tables = torch.arange(bs * 8, dtype=torch.int32, device="cuda").view(bs, 8)
    lens = torch.full((bs,), 8 * cfg.page_size, dtype=torch.int32, device="cuda")
    return q, kv, tables, lens


def test_trtllm_deep_group_decode():
    cfg = ExitConfig(max_batch_size=2)
    q, kv, tables, lens = _inputs(cfg, 2)
    ws_bytes = cfg.max_batch_size * cfg.num_qo_heads * cfg.max_splits * (cfg.head_dim + 1) * 4
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, lens, 8 * cfg.page_size)
    torch.testing.assert_close(out.float().isfinite().all(), torch.tensor(True, device="cuda"))


def test_trtllm_fixed_small_workspace():
    cfg = ExitConfig(max_batch_size=1)
    q, kv, tables, lens = _inputs(cfg, 1)
    workspace = torch.zeros(32 * 1024 * 1024, dtype=torch.uint8, device="cuda")  # ok: FC106
    out = trtllm_batch_decode_with_kv_cache(q, kv, workspace, tables, lens, 8 * cfg.page_size)
    assert out.shape == q.shape
