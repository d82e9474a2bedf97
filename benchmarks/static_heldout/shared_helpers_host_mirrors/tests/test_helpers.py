import numpy as np

from shmirror.helpers.indptr import cumsum_indptr
from shmirror.helpers.pages import last_page_lens


def test_cumsum_indptr_numpy():
    out = cumsum_indptr(np.array([3, 1, 2], dtype=np.int32))
    assert out.tolist() == [0, 3, 4, 6]  # ok: FC109


def test_last_page_lens():
    lens = np.array([16, 17, 1], dtype=np.int32)
    assert last_page_lens(lens, 16).tolist() == [16, 1, 1]
