import numpy as np

from blt.patching import _lens_from_starts


def test_lens_from_starts() -> None:
    starts = np.array([[1, 0, 0, 1, 0], [1, 1, 0, 0, 0]], dtype=bool)
    lens, per_seq = _lens_from_starts(starts)
    assert lens.tolist() == [3, 2, 1, 4]  # ok: FC109
    assert per_seq.tolist() == [2, 2]
