from kvevents import BlockHasher


def test_chained_hashes_share_prefix():
    h = BlockHasher(block_size=4)
    a = h.hash_blocks(list(range(8)))
    b = h.hash_blocks(list(range(4)) + [9, 9, 9, 9])
    assert a[0] == b[0] and a[1] != b[1]  # ok: FC109
