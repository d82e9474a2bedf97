import numpy as np

from jsonmode.automaton import JsonAutomaton, JsonState
from jsonmode.vocab import TokenClassTable


def test_object_key_forces_colon() -> None:
    vocab = ["{", "}", '"', "a", ":", ",", "1", " "] + ["x"] * 24
    auto = JsonAutomaton(TokenClassTable(vocab, eos_id=31, padded_size=32), colon_token=4)
    auto.add_request(0)
    for tok in (0, 2, 3, 2):
        auto.advance(0, tok)
    assert auto.requests[0].forced == [4]  # ok: FC109
    assert auto.requests[0].state == JsonState.VALUE
    assert np.all(auto.allowed_words(0) >= np.iinfo(np.int32).min)
