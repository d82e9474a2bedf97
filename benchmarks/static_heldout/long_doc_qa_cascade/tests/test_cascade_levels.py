from typing import List

import numpy as np

from docqa_srv.forward_batch import group_by_document


def check_levels(doc_ids: np.ndarray, pages, last: np.ndarray, expected_starts: List[int], expected_indptr: List[int]):
    starts, kv_indptr, indices, doc_last = group_by_document(doc_ids, pages, last, 64)
    assert starts.tolist() == expected_starts, f"starts {starts.tolist()} != {expected_starts}"  # ok: FC109
    assert kv_indptr.tolist() == expected_indptr
    return indices, doc_last


def test_groups_are_contiguous():
    doc_ids = np.array([0, 0, 1, 1, 1, 3], dtype=np.int64)
    pages = [np.arange(4, dtype=np.int32), np.arange(4, 6, dtype=np.int32), np.zeros(0, np.int32),
             np.arange(6, 9, dtype=np.int32)]
    last = np.array([64, 10, 1, 33], dtype=np.int32)
    indices, doc_last = check_levels(doc_ids, pages, last, [0, 2, 5, 6], [0, 4, 6, 9])
    assert indices.tolist() == list(range(9))
    assert doc_last.tolist() == [64, 10, 33]


def test_single_document():
    doc_ids = np.zeros(3, dtype=np.int64)
    check_levels(doc_ids, [np.arange(2, dtype=np.int32)], np.array([7], dtype=np.int32), [0, 3], [0, 2])


def test_empty_batch():
    assert group_by_document(np.zeros(0, np.int64), [], np.ones(1, np.int32), 64) is None
