import numpy as np
import torch

from agentkv.cow_pages import CowPagePool


def _pool() -> CowPagePool:
    return CowPagePool(
        num_layers=1, num_pages=64, page_size=4, num_kv_heads=1, head_dim=8,
        max_fanout=4, num_spare_pages=8, device="cpu", dtype=torch.float32,
    )


def test_fork_shares_prefix_pages():
    pool = _pool()
    prefix = pool.allocate(3)
    branches = pool.fork(prefix, [{"name": "search"}, {"name": "calc"}])
    assert len(branches) == 2  # ok: FC109
    np.testing.assert_array_equal(pool.refcounts_host[prefix], np.full(3, 3))


def test_release_returns_unshared_pages():
    pool = _pool()
    pages = pool.allocate(2)
    free_before = pool.num_free
    pool.release(pages)
    assert pool.num_free == free_before + 2
