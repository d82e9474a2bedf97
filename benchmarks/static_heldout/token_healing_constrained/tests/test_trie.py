from tokheal.trie import PrefixTrie


def test_allowed_ids_cover_prefix():
    trie = PrefixTrie.from_vocab([(1, b"ab"), (2, b"abc"), (3, b"b")])
    assert trie.allowed_ids(b"ab").tolist() == [1, 2]
    assert trie.allowed_ids(b"x").size == 0
