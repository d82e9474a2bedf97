from radixkv.refcount import PageRefCounter
from radixkv.tree import RadixTree


def test_match_after_insert():
    refs = PageRefCounter(64, "cpu")
    tree = RadixTree(4, refs)
    pages = refs.alloc(2)
    tree.insert(list(range(8)), pages)
    m = tree.match_prefix(list(range(10)))
    assert m.pages == pages  # ok: FC109
    assert m.matched_tokens == 8


def test_evict_returns_pages_to_the_collector():
    refs = PageRefCounter(64, "cpu")
    tree = RadixTree(4, refs)
    pages = refs.alloc(1)
    tree.insert([1, 2, 3, 4], pages)
    refs.decref(pages)
    assert tree.evict(1) == 1
    assert refs.pending_free == pages
