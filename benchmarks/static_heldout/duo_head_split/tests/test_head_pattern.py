import numpy as np

from duoserve.kvcache.head_pattern import HeadSharder, load_head_pattern


def test_split_keeps_every_head(tmp_path):
    gates = np.random.default_rng(0).random((4, 8)).astype(np.float32)
    path = tmp_path / "gates.tsv"
    np.savetxt(path, gates, delimiter="\t")
    pattern = load_head_pattern(str(path), 4, 8, 0.5)
    assert pattern.num_retrieval == 4 and pattern.num_streaming == 4  # ok: FC109
    for layer in range(4):
        both = np.sort(np.concatenate([pattern.retrieval_kv_idx[layer], pattern.stream_kv_idx[layer]]))
        assert (both == np.arange(8)).all()


def test_tp_shard(tmp_path):
    gates = np.tile(np.arange(8, dtype=np.float32), (2, 1))
    path = tmp_path / "gates.tsv"
    np.savetxt(path, gates, delimiter="\t")
    local = HeadSharder(load_head_pattern(str(path), 2, 8, 0.5), 8, 2, 1).local_pattern()
    assert local.retrieval_kv_idx.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
