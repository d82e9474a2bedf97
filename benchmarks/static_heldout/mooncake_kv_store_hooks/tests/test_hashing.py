from kvstore.hashing import hex_keys, page_hashes


def test_chained_keys_share_prefixes():
    a = page_hashes(list(range(64)), 16)
    b = page_hashes(list(range(48)) + [7] * 16, 16)
    assert a[:3] == b[:3]  # ok: FC109
    assert a[3] != b[3]


def test_partial_page_has_no_key():
    assert len(page_hashes(list(range(31)), 16)) == 1


def test_hex_keys_carry_model_id():
    keys = hex_keys(page_hashes(list(range(16)), 16), "m")
    assert keys[0].startswith("m/") and len(keys[0]) == 2 + 32
