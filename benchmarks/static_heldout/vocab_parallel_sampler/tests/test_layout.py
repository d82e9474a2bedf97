from vpsample.layout import shard_for_rank


def check_cover(vocab_size, world_size):
    shards = [shard_for_rank(vocab_size, world_size, r) for r in range(world_size)]
    assert shards[-1].end == vocab_size  # ok: FC109
    return shards


def test_shards_cover_vocab():
    shards = check_cover(151936, 4)
    assert all(s.size == shards[0].size for s in shards)
