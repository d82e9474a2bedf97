import torch

from lpserve.config import ServeConfig
from lpserve.processors.bad_words import BadWordsProcessor
from lpserve.processors.json_mode import pack_allowed
from lpserve.registry import PROCESSORS, load_plugins


def assert_row_banned(bias, row, token_id):
    assert bias[row, token_id] == float("-inf")  # ok: FC109


def test_registry_loads_builtins():
    names = load_plugins()
    for name in ("repetition", "bad_words", "json_mode"):
        assert name in names
        assert name in PROCESSORS


def test_bad_words_next_token():
    cfg = ServeConfig(vocab_size=64, max_batch_size=2, max_bad_words=4, graph_buckets=(1, 2))
    proc = BadWordsProcessor(cfg, torch.device("cpu"), None)
    proc.banned[7] = [[3, 5], [9]]
    assert proc._banned_next(7, [1, 3]) == [5, 9]


def test_pack_allowed_sets_bits():
    import numpy as np

    out = np.zeros(2, dtype=np.int32)
    pack_allowed(np.array([0, 33]), out)
    assert out[0] == 1 and out[1] == 2
