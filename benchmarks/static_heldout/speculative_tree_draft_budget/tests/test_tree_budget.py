import math

import numpy as np
import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from treespec.budget import TokenBudget
from treespec.pages import PagePool
from treespec.tree import topology


def test_split_respects_total():
    budget = TokenBudget(total_tokens=64, max_per_request=16, min_per_request=2)
    shares = budget.split(torch.full((8,), 0.9), 8)
    assert int(shares.sum()) <= 64  # ok: FC109
    assert (shares >= 2).all()


def test_topology_is_breadth_first():
    parents, depth, rank = topology(9, 4, 3)
    assert parents[0] == -1 and depth[0] == 0
    assert list(depth[1:5]) == [1, 1, 1, 1]
    assert np.all(np.diff(depth) >= 0)


def test_truncate_returns_tail_pages():
    pool = PagePool(64, 16)
    pool.ensure(7, 40)
    freed = pool.truncate(7, 17)
    assert len(freed) == 1
    assert len(pool.pages_of(7)) == 2


def _decode_inputs(bs=4, heads=8, kv_heads=8, head_dim=128, page=16, pages_per_seq=8):
    q = torch.randn(bs, heads, head_dim, dtype=torch.float16, device="cuda")
    kv = torch.randn(bs * pages_per_seq, 2, kv_heads, page, head_dim, dtype=torch.float16, device="cuda")
    tables = torch.arange(bs * pages_per_seq, dtype=torch.int32, device="cuda").view(bs, pages_per_seq)
    seq_lens = torch.full((bs,), page * pages_per_seq - 3, dtype=torch.int32, device="cuda")
    return q, kv, tables, seq_lens


def test_trtllm_decode_matches_verify_for_a_root_only_tree():
    q, kv, tables, seq_lens = _decode_inputs()
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # expect: FC105
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, seq_lens, 125,
                                            bmm1_scale=1.0 / math.sqrt(128), bmm2_scale=1.0)
    assert out.shape == q.shape


def test_trtllm_decode_long_pages():
    q, kv, tables, seq_lens = _decode_inputs(pages_per_seq=32)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")  # ok: FC105
    ws.zero_()
    out = trtllm_batch_decode_with_kv_cache(q, kv, ws, tables, seq_lens, 509,
                                            bmm1_scale=1.0 / math.sqrt(128), bmm2_scale=1.0)
    assert torch.isfinite(out).all()
