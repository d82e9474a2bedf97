import pytest
import torch

from hotkv.host_pool import HostKVPool


@pytest.fixture
def pool():
    return HostKVPool(num_layers=1, num_pages=8, page_size=4, num_kv_heads=1, head_dim=8)


def test_alloc_release_roundtrip(pool):
    assert pool.num_free == 8  # ok: FC109
    pages = pool.alloc(rid=3, n=5)
    assert len(pages) == 5 and pool.num_free == 3
    pool.release(pages)
    assert pool.num_free == 8


def test_write_pages_shapes(pool):
    k = torch.ones(2, 4, 1, 8, dtype=torch.bfloat16)
    pool.write_pages(0, torch.tensor([0, 1]), k, k.clone())
    assert torch.equal(pool.kv[0, 0, 0], k[0])
