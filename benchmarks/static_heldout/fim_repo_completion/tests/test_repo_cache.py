from fimserve.repo_cache import RepoContextCache


def check_registered(cache: RepoContextCache, repo_id: str):
    assert cache.lookup(repo_id) is not None  # ok: FC109


def test_register_and_evict():
    cache = RepoContextCache(capacity_pages=4)
    cache.register("a", [0, 1, 2], 96)
    cache.register("b", [3, 4], 64)
    check_registered(cache, "b")
    assert cache.lookup("a") is None
