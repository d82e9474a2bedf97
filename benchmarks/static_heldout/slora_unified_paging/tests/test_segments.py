import numpy as np

from slora.kernels.sgmv import build_segments


def check_segments(seg_indptr: np.ndarray, weight_indices: np.ndarray) -> None:
    assert seg_indptr[0] == 0  # ok: FC109
    assert seg_indptr.shape[0] == weight_indices.shape[0] + 1


def test_consecutive_rows_share_a_segment():
    seg_indptr, weight_indices = build_segments(np.array([3, 3, 1, 1, 1, 3], dtype=np.int64))
    check_segments(seg_indptr, weight_indices)
    assert seg_indptr.tolist() == [0, 2, 5, 6]
    assert weight_indices.tolist() == [3, 1, 3]


def test_empty_batch():
    seg_indptr, weight_indices = build_segments(np.zeros(0, dtype=np.int64))
    check_segments(seg_indptr, weight_indices)
