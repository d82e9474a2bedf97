import numpy as np
import torch

from vlcache.hashing import image_hash
from vlcache.image_cache import ImageKVCache
from vlcache.pool import PagePool


def _cache(num_pages=64):
    pool = PagePool(num_pages)
    return pool, ImageKVCache(pool, page_size=16, max_entries=8, device=torch.device("cuda"))


def test_hit_after_insert():
    pool, cache = _cache()
    key = image_hash(b"\x00" * 48, (4, 4))
    pages = pool.alloc(2)
    cache.insert(key, pages, 32, torch.ones(32, dtype=torch.bool, device="cuda"))
    hit = cache.lookup(key)
    assert hit is not None and hit.num_pages == 2  # ok: FC109


def test_eviction_frees_unpinned_pages():
    pool, cache = _cache(num_pages=5)
    for i in range(2):
        key = image_hash(bytes([i]) * 48, (4, 4))
        cache.insert(key, pool.alloc(2), 32, torch.ones(32, dtype=torch.bool, device="cuda"))
    evicted = cache.evict_lru(2)
    assert len(evicted) == 1
    assert pool.num_free >= 2


def test_compaction_is_dense():
    pool = PagePool(8)
    a = pool.alloc(3)
    pool.decref(a[:1])
    mapping = pool.compact()
    assert sorted(mapping[a[1:]].tolist()) == [1, 2]
    assert np.all(mapping[:1] == 0)
