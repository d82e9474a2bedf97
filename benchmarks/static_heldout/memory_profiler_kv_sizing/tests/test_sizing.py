"""Host-side checks of the sizing arithmetic and the free stack (no GPU needed)."""

import numpy as np
import torch

from memprof.kv_pool import PagedKVPool
from memprof.limits import EngineLimits, WorkspaceSizes


def small_limits() -> EngineLimits:
    return EngineLimits(
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=512,
        num_layers=2,
        num_qo_heads=4,
        num_kv_heads=2,
        head_dim=16,
        hidden_size=64,
        intermediate_size=128,
        vocab_size=100,
        graph_buckets=[1, 2, 4, 8],
    )


def test_workspace_sizes_scale_with_batch():
    lim = small_limits()
    small = WorkspaceSizes.from_limits(lim)
    big = WorkspaceSizes.from_limits(EngineLimits(**{**lim.__dict__, "max_num_seqs": 64}))
    assert big.decode_graph > small.decode_graph  # ok: FC109
    assert big.total > small.total


def test_free_stack_round_trip():
    lim = small_limits()
    pool = PagedKVPool(lim, num_pages=16, device="cpu", dtype=torch.float32)
    pages = pool.allocate(5)
    assert pages.size == 5
    assert 0 not in pages.tolist()
    pool.release(pages)
    assert pool.num_free_host == 15


def test_growth_respects_cap():
    lim = small_limits()
    pool = PagedKVPool(lim, num_pages=8, device="cpu", dtype=torch.float32, max_pages_cap=12)
    assert pool.grow(10) == 4
    assert pool.num_pages == 12
    assert pool.kv_cache.shape[1] == 12
    assert np.all(pool.free_np[: pool.num_free_host] > 0)
